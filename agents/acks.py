"""When an agent acknowledges a request: after its reply; for a long step, once the
scheduler knows it started; for a step a concurrency limit covers (`exclusive`), when a worker
takes it, before its handler runs.

The broker closes a channel whose delivery stays unacknowledged longer than its consumer
timeout (RabbitMQ: `consumer_timeout`, 30 minutes by default) and redelivers the message: a step
longer than that would run again, on this agent or another. A request whose execution budget
is at least half the consumer timeout is therefore acknowledged as soon as its `step.started`
message is confirmed by the broker: from then on the database's clocks own its recovery (the
heartbeat clock when the step has one, else its execution deadline), not the broker's
redelivery. Shorter steps keep the acknowledgement after the reply, so an agent that dies
mid-step has its request redelivered at once to another instance. Only requests of a scheduler
that applies `started` messages (those carrying `wait_ms`) can be acknowledged early
(docs/timeouts.md, "Long steps and the broker's consumer timeout").

A request that waited in this process longer than its wait budget before a worker could take
it is not started at all: the wait clock gives that attempt back to the scheduler (uncharged),
which may already have dispatched the step again.

An `exclusive` request (a concurrency limit covers its step: at most N at once, per key) must
never run twice at once: a delivery left unacknowledged while its handler runs comes back when
the connection drops (a broker restart, a network cut) or the agent dies, to this agent or
another, possibly after the database gave the attempt up and started the next one, which would
then run beside it. So it is acknowledged before its handler starts, and the worker waits for
that: from then on the broker holds no copy, the attempt runs at most once, and the database's
clocks recover it if the agent dies (docs/flow-control.md, "Under faults").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from sasflow.agents.jobs import AgentStats, Job
from sasflow.errors import BrokerUnavailableError
from sasflow.transport.base import Transport

DEFAULT_CONSUMER_TIMEOUT = 1800.0
"""RabbitMQ's default `consumer_timeout`, in seconds."""


def acks_at_start(job: Job, consumer_timeout: float | None) -> bool:
    """Whether `job`'s request is acknowledged once its start is confirmed."""
    budget = job.request.budget_ms / 1000
    return (
        consumer_timeout is not None
        and job.request.wait_ms is not None
        and budget >= consumer_timeout / 2
    )


def waited_too_long(job: Job) -> bool:
    """Whether `job` waited here, untaken, past its request's wait budget."""
    wait_ms = job.request.wait_ms
    return wait_ms is not None and time.monotonic() - job.received > wait_ms / 1000


class EarlyAcks:
    """Acknowledges the requests of long steps whose start the broker confirmed (owner
    thread)."""

    def __init__(
        self, transport: Transport, consumer_timeout: float | None, stats: AgentStats
    ) -> None:
        self._transport = transport
        self._consumer_timeout = consumer_timeout
        self._stats = stats

    def settle(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            if (
                job.start_confirmed
                and not job.acked
                and not job.abandoned
                and acks_at_start(job, self._consumer_timeout)
                and self._transport.ack(job.delivery)
            ):
                job.acked = True
                self._stats.acked_at_start += 1


def ack_taken(transport: Transport, job: Job, stats: AgentStats) -> bool:
    """From a worker thread: whether `job` may run now. An `exclusive` request is acknowledged
    first, on the owner thread (which alone touches the connection), and runs only once the
    ack went out on the connection it arrived on, and if waiting for that did not take it past
    its wait budget; otherwise it is not run here (its connection gone, the broker has it
    again; acked but late, the step's wait clock gives the attempt back). Other requests run
    at once."""
    if not job.request.exclusive:
        return True
    done = threading.Event()
    acked: list[bool] = []

    def ack() -> None:  # the owner thread
        try:
            if not job.acked and not job.abandoned:
                job.acked = transport.ack(job.delivery)
                acked.append(job.acked)
                if job.acked:
                    stats.acked_at_take += 1
        finally:
            done.set()

    try:
        transport.call_threadsafe(ack)
    except BrokerUnavailableError:
        return False
    done.wait(job.call.remaining())
    return bool(acked) and acked[0] and not waited_too_long(job)
