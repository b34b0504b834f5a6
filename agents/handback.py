"""Requests an agent process hands back unstarted, for another process of the same agent.

Mixed versions are normal: during a rolling deploy an older process may receive a request for
an action only the newer ones have. It never fails the step for that. It requeues the request
(basic.nack with requeue), so the broker gives it to another consumer of the queue, up to
HANDBACK_LIMIT times per attempt in this process; after that (no other process took it: none
may have the action, or they are all busy) it replies `deferred` with a growing delay, which the
scheduler applies without counting a failure until the step's give-up age
(docs/agents.md, "Mixed versions").

A stopping or wedged process hands back the requests it took from the broker but no worker
started (they wait in its local queue): requeued at once, another process runs them without
waiting for the step's wait clock. `take` (a worker thread) and `give_back` (the owner thread)
decide under one lock which of the two happens to a job.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import MutableMapping
from typing import TypeVar

from sasflow.agents.agent import Agent
from sasflow.agents.jobs import AgentStats, Job
from sasflow.agents.replies import make_reply
from sasflow.messages import ErrorInfo, Reply
from sasflow.states import ReplyStatus
from sasflow.transport.base import Transport

log = logging.getLogger(__name__)

HANDBACK_LIMIT = 3
"""Times one process requeues one attempt of an action it lacks before it defers the step."""
DEFER_FIRST_S = 1.0
"""The first deferral of a step whose action this process lacks; doubled for each next one."""
DEFER_MOST_S = 60.0
"""The longest such deferral."""
REMEMBERED = 10_000
"""Steps whose hand-backs a process remembers (the oldest forgotten first)."""

_K = TypeVar("_K")


class HandBacks:
    """What one agent process handed back, and the take/give-back race of unstarted jobs."""

    def __init__(self) -> None:
        self._requeued: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._deferred: OrderedDict[int, int] = OrderedDict()
        self._lock = threading.Lock()

    # -- an action this process lacks (owner thread) ------------------------------------------

    def requeue_again(self, step_id: int, attempt: int) -> bool:
        """Whether to requeue this attempt once more (counted) rather than defer it."""
        key = (step_id, attempt)
        count = self._requeued.pop(key, 0)
        if count >= HANDBACK_LIMIT:
            return False
        self._requeued[key] = count + 1
        _trim(self._requeued)
        return True

    def defer_seconds(self, step_id: int) -> float:
        """The deferral of this step now: DEFER_FIRST_S, doubled at each deferral here."""
        count = self._deferred.pop(step_id, 0)
        self._deferred[step_id] = count + 1
        _trim(self._deferred)
        return min(DEFER_MOST_S, DEFER_FIRST_S * float(2 ** min(count, 16)))

    # -- unstarted jobs ------------------------------------------------------------------------

    def take(self, job: Job) -> bool:
        """A worker thread takes `job`: False when the owner gave it back already."""
        with self._lock:
            if job.handed_back:
                return False
            job.taken = True
            return True

    def give_back(self, job: Job) -> bool:
        """The owner thread gives `job` back unless a worker took it; the caller requeues it."""
        with self._lock:
            if job.taken or job.handed_back:
                return False
            job.handed_back = True
            return True


def lacks_action(
    backs: HandBacks,
    job: Job,
    *,
    agent: Agent,
    instance_id: str,
    transport: Transport,
    stats: AgentStats,
) -> Reply | None:
    """A request for an action this process lacks (owner thread): requeued for another
    process of the agent (None), or, past HANDBACK_LIMIT, the `deferred` reply saying why."""
    request = job.request
    if backs.requeue_again(request.step_id, request.attempt):
        log.info(
            "step %s attempt %s: no action %r here: handed back to %s",
            request.step_id,
            request.attempt,
            request.action,
            job.delivery.queue,
        )
        if transport.requeue(job.delivery):
            stats.handed_back += 1
        return None
    known = ", ".join(sorted(agent.actions)) or "none"
    delay = backs.defer_seconds(request.step_id)
    message = (
        f"instance {instance_id} of agent {agent.name!r} has no action {request.action!r} "
        f"(it has: {known}) and no other instance took the step; deferred {delay:g}s for an "
        "instance that has it"
    )
    log.warning("step %s attempt %s: %s", request.step_id, request.attempt, message)
    return make_reply(
        agent.name,
        request,
        ReplyStatus.DEFERRED,
        defer_seconds=delay,
        error=ErrorInfo(type="ActionNotHere", message=message),
    )


def give_back_unstarted(
    backs: HandBacks,
    jobs: MutableMapping[tuple[int, int], Job],
    transport: Transport,
    stats: AgentStats,
) -> None:
    """Requeue the requests of `jobs` no worker took yet, for other processes (owner
    thread); they leave `jobs`."""
    for key, job in list(jobs.items()):
        if backs.give_back(job):
            del jobs[key]
            if transport.requeue(job.delivery):
                stats.handed_back += 1


def _trim(counts: OrderedDict[_K, int]) -> None:
    while len(counts) > REMEMBERED:
        counts.popitem(last=False)
