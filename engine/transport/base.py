"""The Transport port: the few broker operations the sasflow roles need.

A transport is owned by one thread (the one that created it); other threads hand work back
with `call_threadsafe`. RabbitMQ implements it in `sasflow.transport.rabbitmq`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Delivery:
    """One consumed message; `generation` identifies the connection it arrived on."""

    tag: int
    body: bytes
    queue: str
    generation: int
    redelivered: bool = False
    headers: Mapping[str, Any] = field(default_factory=dict)
    correlation_id: str | None = None
    reply_to: str | None = None
    content_type: str | None = None
    message_id: str | None = None


@dataclass(frozen=True)
class Outgoing:
    """One message to publish (persistent, JSON)."""

    exchange: str
    routing_key: str
    body: bytes
    headers: Mapping[str, Any] | None = None
    expiration_ms: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    mandatory: bool = False


class Transport(Protocol):
    """Broker operations; every failure of the connection raises BrokerUnavailableError."""

    @property
    def generation(self) -> int:
        """Incremented on every (re)connection; deliveries of older generations cannot be acked."""
        ...

    def connect(self) -> None: ...

    def close(self) -> None: ...

    def declare_exchange(self, name: str, kind: str) -> None: ...

    def declare_queue(
        self,
        name: str,
        *,
        dead_letter_exchange: str | None,
        max_length: int | None = None,
        expires_ms: int | None = None,
        work: bool = False,
    ) -> None:
        """A durable queue; `max_length` drops the oldest beyond it, `expires_ms` lets the
        broker delete the queue once it had no consumer for that long (RabbitMQ's x-expires;
        the in-process bus, whose queues end with the process, only checks equivalence).
        `work`: a work queue that must outlive a broker node, declared with the deployment's
        queue type (sasflow.transport.queues); otherwise an explicitly classic queue."""
        ...

    def bind_queue(self, queue: str, exchange: str, routing_key: str) -> None: ...

    def consumer_count(self, queue: str) -> int:
        """How many consumers the (declared) queue has now."""
        ...

    def message_count(self, queue: str) -> int:
        """How many messages the (declared) queue holds ready now (not those taken unacked)."""
        ...

    def consume(self, queue: str, handler: Callable[[Delivery], None], *, prefetch: int) -> None:
        """Start delivering `queue` to `handler` (called on the owner thread from `process`).

        When the broker cancels the consumer (the queue deleted, or its node lost while the
        connection stays up), the next `process` raises ConsumerCancelledError, a
        BrokerUnavailableError: the owner handles it as a lost connection (connect, declare,
        consume again)."""
        ...

    def cancel_consumers(self, queue: str | None = None) -> None:
        """Stop every consumer of this connection, or those of `queue` (a cancel by the broker
        is then not raised for them); deliveries taken stay unacked until acked or requeued."""
        ...

    def get(self, queue: str) -> Delivery | None:
        """Take one message from `queue` without a consumer (to be acked), or None if empty."""
        ...

    def publish(self, message: Outgoing) -> None:
        """Publish persistently and wait for the broker's confirm (PublishError if refused)."""
        ...

    def publish_many(self, messages: Sequence[Outgoing]) -> list[Exception | None]:
        """Publish every message persistently and wait until the broker settled all of them.

        Returns one entry per message, in order: None when confirmed, the PublishError that
        refused it (an UnroutableError when no queue took a mandatory message; not sendable),
        or a BrokerUnavailableError for a message not taken (nacked by the broker) or not sent
        because the broker closed the channel over an earlier one of the batch (send it again
        after reconnecting). Raises BrokerUnavailableError when the connection fails;
        then no message of the batch may be assumed delivered.
        """
        ...

    def ack(self, delivery: Delivery, *, multiple: bool = False) -> bool:
        """Ack; False when the delivery's connection is gone (the broker will redeliver it)."""
        ...

    def dead_letter(self, delivery: Delivery, reason: str, *, dead_letter_exchange: str) -> None:
        """Publish a copy of `delivery` with `reason` to the dead-letter exchange, then ack it."""
        ...

    def requeue(self, delivery: Delivery) -> bool:
        """Hand `delivery` back to its queue unprocessed (it comes back as redelivered, near
        the head); False when its connection is gone (the broker requeued it already)."""
        ...

    def process(self, time_limit: float) -> None:
        """Deliver messages and thread-safe callbacks for up to `time_limit` seconds; then
        raise ConsumerCancelledError if the broker cancelled a consumer meanwhile (after the
        deliveries that arrived before the cancel)."""
        ...

    def call_threadsafe(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the owner thread during `process` (safe from any thread)."""
        ...


@dataclass
class PublishTicket:
    """A batch handed to the broker by `AsyncPublisher.publish_nowait`, not yet settled."""

    results: list[Exception | None]
    tags: dict[int, int]
    """Index in the batch -> the broker's delivery tag (messages not sendable have none)."""
    generation: int


@runtime_checkable
class AsyncPublisher(Protocol):
    """A transport that can publish a batch without waiting for the broker's confirms (the
    scheduler's relay: its loop goes on while the broker syncs the batch to disk)."""

    def publish_nowait(self, messages: Sequence[Outgoing]) -> PublishTicket:
        """Write every message persistently and return at once; BrokerUnavailableError when
        the connection fails (then no message may be assumed delivered)."""
        ...

    def settled(self, ticket: PublishTicket, *, wait: bool) -> list[Exception | None] | None:
        """The batch's results as `publish_many` gives them once the broker settled every
        message; None while it has not (with `wait`, process the broker's I/O until it has).
        Raises BrokerUnavailableError when the channel the batch went out on is gone."""
        ...

    def forget(self, ticket: PublishTicket) -> None:
        """Drop what is known of a batch its owner gave up (rolled back, to publish again):
        its confirms, arrived or to come, are no longer kept for it."""
        ...
