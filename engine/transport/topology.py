"""Queue and exchange names of one namespace, and their declaration."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from sasflow.errors import BrokerUnavailableError, UnroutableError
from sasflow.transport.base import Delivery, Outgoing, Transport

log = logging.getLogger(__name__)

DEAD_REQUESTS_MAX = 100_000
"""Bound of the supervisor's dead-request copy (oldest dropped first) when none consumes it."""

REASON_HEADER = "x-sasflow-reason"
SOURCE_HEADER = "x-sasflow-source-queue"
PROCESS_HEADER = "x-sasflow-process"
DEAD_AT_HEADER = "x-sasflow-dead-lettered-at"
"""When the copy was made (ISO-8601, UTC, the dead-lettering process's clock): its age in
`sasflow dead list` (the broker's own dead letters carry it in `x-death`)."""
FLEET_MAX = 10_000
"""Bound of the fleet queue (oldest heartbeats dropped first) while no scheduler consumes it."""
BREAKER_QUEUE_MAX = 1_000
BREAKER_QUEUE_EXPIRES_MS = 60_000
"""An agent instance's breaker queue is deleted by the broker once unused this long."""
CONTROL_QUEUE_MAX = 1_000
CONTROL_QUEUE_EXPIRES_MS = 300_000
"""An agent process's control queue is deleted by the broker once unused this long: a cancel
published while the process reconnects waits this long for it (agents.cancels)."""
REASON_LIMIT = 4000
"""Characters of a dead-letter reason kept in its header."""


def dead_letter_copy(
    delivery: Delivery, reason: str, *, dead_letter_exchange: str, process_name: str
) -> Outgoing:
    """The copy of `delivery` a transport publishes to the dead-letter exchange: its body and
    properties, its own headers less earlier sasflow ones, and why, where from and by whom."""
    headers = {k: v for k, v in delivery.headers.items() if not k.startswith("x-sasflow-")}
    headers[REASON_HEADER] = reason[:REASON_LIMIT]
    headers[SOURCE_HEADER] = delivery.queue
    headers[PROCESS_HEADER] = process_name
    headers[DEAD_AT_HEADER] = datetime.now(UTC).isoformat()
    return Outgoing(
        exchange=dead_letter_exchange,
        routing_key=delivery.queue,
        body=delivery.body,
        headers=headers,
        correlation_id=delivery.correlation_id,
        reply_to=delivery.reply_to,
        # Never silently dropped: with the dead-letter queue gone the copy comes back, and the
        # transport reconnects (declaring it again) instead of acking the original.
        mandatory=True,
    )


def dead_letter(
    transport: Transport,
    delivery: Delivery,
    reason: str,
    *,
    dead_letter_exchange: str,
    process_name: str,
) -> None:
    """Publish `delivery`'s dead-letter copy (confirmed), then ack the original: what both
    transports' `dead_letter` do."""
    copy = dead_letter_copy(
        delivery, reason, dead_letter_exchange=dead_letter_exchange, process_name=process_name
    )
    try:
        transport.publish(copy)
    except UnroutableError as exc:
        # The dead-letter queue is gone: the original stays unacked, and the role's
        # reconnect declares the queue again before the message comes back.
        raise BrokerUnavailableError(f"dead letter not routed, reconnecting: {exc}") from exc
    log.warning("dead-lettered a message from %s: %s", delivery.queue, reason)
    transport.ack(delivery)


@dataclass(frozen=True)
class Names:
    """Every broker name of a namespace (docs/protocol.md lists them)."""

    namespace: str

    @property
    def submit(self) -> str:
        return f"{self.namespace}.submit"

    @property
    def events(self) -> str:
        """Inbound events for event waits (consumed by the submitter role)."""
        return f"{self.namespace}.events"

    @property
    def replies(self) -> str:
        return f"{self.namespace}.replies"

    @property
    def status(self) -> str:
        return f"{self.namespace}.status"

    @property
    def alerts(self) -> str:
        return f"{self.namespace}.alerts"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.namespace}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.namespace}.dead"

    @property
    def dead_requests(self) -> str:
        """The supervisor's copy of dead-lettered requests (the operator's stays in .dead)."""
        return f"{self.namespace}.dead.requests"

    def agent(self, name: str) -> str:
        return f"{self.namespace}.agent.{name}"

    @property
    def fleet(self) -> str:
        """The topic exchange of agent heartbeats (routing key: the agent's name), and the
        queue every scheduler consumes them from."""
        return f"{self.namespace}.fleet"

    def breakers(self, agent: str) -> str:
        """The fanout exchange on which the instances of `agent` share breaker changes."""
        return f"{self.namespace}.breakers.{agent}"

    def breaker_queue(self, agent: str, instance: str) -> str:
        """One agent instance's queue of its peers' breaker changes."""
        return f"{self.namespace}.breakers.{agent}.{instance}"

    @property
    def control(self) -> str:
        """The topic exchange of cancels for running steps (routing key: the agent's name)."""
        return f"{self.namespace}.control"

    def control_queue(self, agent: str, instance: str) -> str:
        """One agent instance's queue of the cancels for its agent's steps."""
        return f"{self.namespace}.control.{agent}.{instance}"

    def pool(self, agent: str, pool: str) -> str:
        """The queue of agent `agent`'s instances started with `--pool POOL`."""
        return f"{self.namespace}.agent.{agent}.pool.{pool}"

    def agent_queue(self, agent: str, pool: str | None) -> str:
        """Where a step of `agent` goes: its pool's queue, or the agent's shared one."""
        return self.agent(agent) if pool is None else self.pool(agent, pool)

    def all_queues(self, agents: Iterable[str]) -> list[str]:
        return [
            self.submit,
            self.events,
            self.replies,
            self.dead_letter_queue,
            self.dead_requests,
            self.fleet,
            *(self.agent(a) for a in agents),
        ]


def declare_common(transport: Transport, names: Names) -> None:
    """Exchanges and queues every role relies on (idempotent)."""
    # Dead letters are routed by their source queue's name: every one reaches <ns>.dead, and
    # requests (from <ns>.agent.*) also reach the supervisor's bounded copy.
    transport.declare_exchange(names.dead_letter_exchange, "topic")
    transport.declare_queue(names.dead_letter_queue, dead_letter_exchange=None, work=True)
    transport.bind_queue(names.dead_letter_queue, names.dead_letter_exchange, "#")
    transport.declare_queue(
        names.dead_requests, dead_letter_exchange=None, max_length=DEAD_REQUESTS_MAX, work=True
    )
    transport.bind_queue(
        names.dead_requests, names.dead_letter_exchange, f"{names.namespace}.agent.#"
    )
    transport.declare_exchange(names.status, "topic")
    transport.declare_exchange(names.alerts, "topic")
    for queue in (names.submit, names.events, names.replies):
        transport.declare_queue(queue, dead_letter_exchange=names.dead_letter_exchange, work=True)
    transport.declare_exchange(names.fleet, "topic")
    # The relay publishes cancels here whether or not an agent listens (unrouted: dropped).
    transport.declare_exchange(names.control, "topic")
    # A work queue by type, though its messages are not work: every role declares it when it
    # connects, and a classic queue whose node is down cannot be declared (404), so on a
    # cluster it must be as replicated as the work queues or the loss of its node stops them.
    transport.declare_queue(names.fleet, dead_letter_exchange=None, max_length=FLEET_MAX, work=True)
    transport.bind_queue(names.fleet, names.fleet, "#")


def declare_agent_queue(
    transport: Transport, names: Names, agent: str, pool: str | None = None
) -> None:
    transport.declare_queue(
        names.agent_queue(agent, pool), dead_letter_exchange=names.dead_letter_exchange, work=True
    )


def declare_breaker_queue(transport: Transport, names: Names, agent: str, instance: str) -> str:
    """The fanout exchange of `agent`'s breakers and this instance's queue bound to it (deleted
    by the broker a while after the instance is gone); returns the queue's name."""
    queue = names.breaker_queue(agent, instance)
    transport.declare_exchange(names.breakers(agent), "fanout")
    transport.declare_queue(
        queue,
        dead_letter_exchange=None,
        max_length=BREAKER_QUEUE_MAX,
        expires_ms=BREAKER_QUEUE_EXPIRES_MS,
    )
    transport.bind_queue(queue, names.breakers(agent), "")
    return queue


def declare_control_queue(transport: Transport, names: Names, agent: str, instance: str) -> str:
    """The control exchange and this instance's queue bound to it with `agent` (deleted by the
    broker a while after the instance is gone); returns the queue's name. Every instance of the
    agent gets each cancel: only the one running that attempt acts on it."""
    queue = names.control_queue(agent, instance)
    transport.declare_exchange(names.control, "topic")
    transport.declare_queue(
        queue,
        dead_letter_exchange=None,
        max_length=CONTROL_QUEUE_MAX,
        expires_ms=CONTROL_QUEUE_EXPIRES_MS,
    )
    transport.bind_queue(queue, names.control, agent)
    return queue
