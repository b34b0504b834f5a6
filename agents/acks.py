"""When an agent acknowledges a request: after its reply, or, for a long step, once the
scheduler knows it started.

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
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from sasflow.agents.jobs import AgentStats, Job
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
