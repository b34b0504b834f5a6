"""An agent's `step.started` and `step.heartbeat` messages (docs/timeouts.md, docs/protocol.md
4.6): a worker thread that takes a request says so, and a long handler says it is alive.

Worker threads queue the messages and never wait for the broker; the owner thread publishes
what is queued at each pass of its loop (`flush`), as one batch with confirms and `mandatory`,
like replies; queuing wakes it. A message still queued when its attempt's reply is ready is
not sent: the reply says more (a quick handler's reply often goes alone).

Only requests that carry `wait_ms` get these messages: they come from a scheduler that applies
them. An older scheduler's request is timed from its receipt, as before, and gets none.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
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


def start_budget(job: Job) -> float:
    """The attempt's deadline when a worker takes it now: the whole execution budget from now
    (older schedulers' requests: from receipt, as the call has it)."""
    if job.request.wait_ms is None:
        return job.call.deadline
    return time.monotonic() + job.request.budget_ms / 1000


class ProgressLink:
    """Queues (worker threads) and publishes (owner thread) one agent process's progress."""

    def __init__(self, transport: Transport, names: Names, agent: str, stats: AgentStats) -> None:
        self._transport = transport
        self._names = names
        self._agent = agent
        self._stats = stats
        self._queued: list[tuple[Job, ProgressType]] = []
        self._lock = threading.Lock()

    @property
    def queued(self) -> bool:
        return bool(self._queued)

    # -- worker threads -------------------------------------------------------------------

    def start(self, job: Job) -> Call:
        """A worker takes `job` now: its call, timed from now, with its heartbeat; `started`
        is queued (requests of a scheduler that applies it only)."""
        request = job.request
        if request.wait_ms is None:
            return job.call
        beat = None
        if request.heartbeat_ms is not None:
            interval = request.heartbeat_ms / 1000 / BEATS_PER_TIMEOUT
            beat = Beat(interval, lambda: self._queue(job, "step.heartbeat"))
        call = replace(job.call, deadline=start_budget(job), beat=beat)
        self._queue(job, "step.started")
        return call

    def _queue(self, job: Job, kind: ProgressType) -> None:
        with self._lock:
            self._queued.append((job, kind))
        with contextlib.suppress(BrokerUnavailableError):
            self._transport.call_threadsafe(lambda: None)

    # -- owner thread ---------------------------------------------------------------------

    def flush(self, running: Callable[[Job], bool]) -> None:
        """Publish what is queued for the jobs still `running` (no reply ready), as one batch.

        Raises BrokerUnavailableError with the unsent messages queued again for the next
        connection; a message the broker refuses is dropped with a warning: the step falls
        back on its envelope deadline, or its reply comes first."""
        with self._lock:
            taken, self._queued = self._queued, []
        sending = [(job, kind) for job, kind in taken if running(job)]
        if not sending:
            return
        messages = [self._message(job, kind) for job, kind in sending]
        try:
            results = self._transport.publish_many(messages)
        except BrokerUnavailableError:
            self._requeue(sending)
            raise
        unsent = []
        for (job, kind), result in zip(sending, results, strict=True):
            if result is None:
                if kind == "step.started":
                    self._stats.started += 1
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
            self._requeue(unsent)
            raise BrokerUnavailableError("the broker closed the channel while sending progress")

    def _requeue(self, items: list[tuple[Job, ProgressType]]) -> None:
        with self._lock:
            self._queued = items + self._queued

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
