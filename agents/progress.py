"""An agent's `step.started` and `step.heartbeat` messages (docs/timeouts.md, docs/protocol.md
4.6): an attempt a worker took is running, and a long handler is alive.

A worker thread that takes a request notes when (`start`: the execution clock runs from then)
and goes on with the handler; it never waits for the broker. The owner thread publishes, at
its passes, the `started` of every attempt that has run for `STARTED_LINGER` with no reply
ready (a quick handler's reply goes alone: no extra message, no extra write for the scheduler),
and the heartbeats worker threads queued (`Call.heartbeat()`, which wakes it), as one batch
with confirms and `mandatory`, like replies.

Only requests that carry `wait_ms` get these messages: they come from a scheduler that applies
them. An older scheduler's request is timed from its receipt, as before, and gets none.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from sasflow.agents.agent import Call
from sasflow.agents.jobs import AgentStats, Job
from sasflow.errors import BrokerUnavailableError, PublishError
from sasflow.messages import Progress, ProgressType
from sasflow.transport.base import Outgoing, Transport
from sasflow.transport.topology import Names

log = logging.getLogger(__name__)

BEATS_PER_TIMEOUT = 3
"""`Call.heartbeat()` sends at most this many heartbeats per heartbeat timeout."""
STARTED_LINGER = 0.05
"""Seconds an attempt runs before its `started` is sent (at most a quarter of its budget):
most replies come first, and make it needless. The scheduler's execution clock is then more
lenient than the agent's by this much, never stricter."""


class Beat:
    """The rate-limited heartbeat of one attempt: callable from any thread, cheap."""

    def __init__(self, interval: float, send: Callable[[], None]) -> None:
        self._interval = interval
        self._send = send
        self._last = time.monotonic()  # `started` counts as the first sign of life
        self._lock = threading.Lock()

    def __call__(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < self._interval:
                return
            self._last = now
        self._send()


def clocked(job: Job) -> bool:
    """Whether the job's scheduler applies progress messages (its request has `wait_ms`)."""
    return job.request.wait_ms is not None


class ProgressLink:
    """Times, queues (worker threads) and publishes (owner thread) one agent's progress."""

    def __init__(self, transport: Transport, names: Names, agent: str, stats: AgentStats) -> None:
        self._transport = transport
        self._names = names
        self._agent = agent
        self._stats = stats
        self._beats: list[Job] = []
        self._lock = threading.Lock()

    # -- worker threads -------------------------------------------------------------------

    def start(self, job: Job) -> Call:
        """A worker takes `job` now: its call, timed from now (the whole execution budget),
        with its heartbeat. Older schedulers' requests keep the call timed from receipt."""
        request = job.request
        if not clocked(job):
            return job.call
        now = time.monotonic()
        budget = request.budget_ms / 1000
        beat = None
        if request.heartbeat_ms is not None:
            beat = Beat(request.heartbeat_ms / 1000 / BEATS_PER_TIMEOUT, lambda: self._beat(job))
        call = replace(job.call, deadline=now + budget, beat=beat)
        job.started_due = now + min(STARTED_LINGER, budget / 4)
        job.begun = True
        return call

    def _beat(self, job: Job) -> None:
        with self._lock:
            self._beats.append(job)
        with contextlib.suppress(BrokerUnavailableError):
            self._transport.call_threadsafe(lambda: None)

    # -- owner thread ---------------------------------------------------------------------

    @staticmethod
    def next_due(jobs: Iterable[Job]) -> float | None:
        """When the next `started` may fall due (monotonic), or None: a job a worker has not
        taken yet may be taken any moment, so it is looked at again within the linger."""
        soon = time.monotonic() + STARTED_LINGER
        due = [
            j.started_due if j.begun else soon
            for j in jobs
            if not (j.announced or j.abandoned or j.held) and clocked(j)
        ]
        return min(due, default=None)

    def flush(self, jobs: Iterable[Job], running: Callable[[Job], bool]) -> None:
        """Publish, as one batch, the `started` of the `jobs` due by now and the heartbeats
        queued, of the jobs still `running` (no reply ready).

        Raises BrokerUnavailableError with what was not sent kept for the next connection; a
        message the broker refuses is dropped with a warning: the step falls back on its
        envelope deadline, or its reply comes first."""
        now = time.monotonic()
        sending: list[tuple[Job, ProgressType]] = [
            (job, "step.started")
            for job in jobs
            if job.begun and not job.announced and job.started_due <= now and running(job)
        ]
        with self._lock:
            beats, self._beats = self._beats, []
        sending += [(job, "step.heartbeat") for job in beats if running(job)]
        if not sending:
            return
        for job, kind in sending:
            if kind == "step.started":
                job.announced = True
        try:
            results = self._transport.publish_many([self._message(j, k) for j, k in sending])
        except BrokerUnavailableError:
            self._unsent(sending)
            raise
        unsent = []
        for (job, kind), result in zip(sending, results, strict=True):
            if result is None:
                if kind == "step.started":
                    self._stats.started += 1
                    job.start_confirmed = True
                else:
                    self._stats.heartbeats += 1
            elif isinstance(result, BrokerUnavailableError):
                unsent.append((job, kind))
            elif isinstance(result, PublishError):
                log.warning(
                    "step %s attempt %s: %s not sent: %s",
                    job.request.step_id,
                    job.request.attempt,
                    kind,
                    result,
                )
        if unsent:
            self._unsent(unsent)
            raise BrokerUnavailableError("the broker closed the channel while sending progress")

    def _unsent(self, items: list[tuple[Job, ProgressType]]) -> None:
        """Send these again on the next connection."""
        for job, kind in items:
            if kind == "step.started":
                job.announced = False
        with self._lock:
            self._beats = [j for j, k in items if k == "step.heartbeat"] + self._beats

    def _message(self, job: Job, kind: ProgressType) -> Outgoing:
        request = job.request
        body = Progress(
            type=kind, step_id=request.step_id, attempt=request.attempt, agent=self._agent
        ).encode()
        return Outgoing(
            exchange="",
            routing_key=job.delivery.reply_to or self._names.replies,
            body=body,
            correlation_id=job.delivery.correlation_id,
            mandatory=True,
        )
