"""The in-process bus's data (messages, queues, exchanges, consumers, connections) and the AMQP
rules that need no lock: topic matching, RabbitMQ's dead-letter headers, what may be sent.

Only `sasflow.transport.memory` uses these; its MemoryBroker's lock guards every mutable field.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sasflow.errors import PublishError
from sasflow.transport.base import Delivery, Outgoing

JSON = "application/json"
EXCHANGE_KINDS = ("direct", "topic", "fanout")
MAX_SHORT_STRING = 255
"""AMQP short strings (routing key, correlation id, reply_to) hold at most 255 bytes."""
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
"""RabbitMQ's default `max_message_size`."""


@dataclass
class Message:
    exchange: str
    routing_key: str
    body: bytes
    headers: dict[str, Any]
    expiration_ms: int | None
    correlation_id: str | None
    reply_to: str | None
    expires_at: float | None = None
    redelivered: bool = False
    queued: bool = False  # in a queue's ready list; an expiry entry of one that is not is stale


@dataclass(eq=False)
class Queue:
    name: str
    dead_letter_exchange: str | None
    max_length: int | None
    expires_ms: int | None = None
    """Checked for equivalence only: the bus's queues end with the process anyway."""
    ready: deque[Message] = field(default_factory=deque)
    consumers: list[Consumer] = field(default_factory=list)
    turn: int = 0


@dataclass(eq=False)
class Exchange:
    name: str
    kind: str
    bindings: dict[tuple[str, str], None] = field(default_factory=dict)  # (queue, key), ordered


@dataclass(eq=False)
class Consumer:
    channel: Channel
    queue: Queue
    handler: Callable[[Delivery], None]
    prefetch: int
    unacked: int = 0
    active: bool = True

    def has_room(self) -> bool:
        return self.prefetch <= 0 or self.unacked < self.prefetch  # 0: unlimited, as in AMQP


@dataclass(eq=False)
class Unacked:
    message: Message
    queue: Queue
    consumer: Consumer | None


@dataclass(eq=False)
class Channel:
    """One connection of a MemoryTransport (its channel and its connection are one thing)."""

    process_name: str
    generation: int
    wake: threading.Condition
    open: bool = True
    closed_because: str = ""
    tags: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    unacked: dict[int, Unacked] = field(default_factory=dict)  # insertion order = tag order
    inbox: deque[tuple[Consumer, Delivery]] = field(default_factory=deque)
    callbacks: deque[Callable[[], None]] = field(default_factory=deque)
    consumers: list[Consumer] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    """Queues whose consumer the broker cancelled (queue deleted), raised by `process`."""


def topic_matches(pattern: str, routing_key: str) -> bool:
    """AMQP topic matching: words split on dots, `*` is one word, `#` zero or more."""
    return _match(tuple(pattern.split(".")), tuple(routing_key.split(".")))


def _match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_match(rest, words[i:]) for i in range(len(words) + 1))
    return bool(words) and head in ("*", words[0]) and _match(rest, words[1:])


def record_death(message: Message, queue: str, reason: str) -> dict[str, Any]:
    """`message`'s headers with RabbitMQ's dead-letter record added: the `x-death` entry of
    (queue, reason) counted up and moved first, and the `x-first-death-*` headers."""
    headers = message.headers
    deaths = [d for d in headers.get("x-death") or [] if isinstance(d, dict)]
    entry = next((d for d in deaths if d.get("queue") == queue and d.get("reason") == reason), None)
    if entry is not None:
        deaths.remove(entry)
        entry["count"] = int(entry.get("count", 0)) + 1
    else:
        entry = {
            "count": 1,
            "reason": reason,
            "queue": queue,
            "exchange": message.exchange,
            "routing-keys": [message.routing_key],
        }
        if message.expiration_ms is not None:
            entry["original-expiration"] = str(message.expiration_ms)
    entry["time"] = datetime.now(UTC).replace(microsecond=0)
    headers["x-death"] = [entry, *deaths]
    headers.setdefault("x-first-death-reason", reason)
    headers.setdefault("x-first-death-queue", queue)
    headers.setdefault("x-first-death-exchange", message.exchange)
    return headers


def check_sendable(message: Outgoing) -> None:
    """PublishError for what RabbitMQ (or pika) would refuse to send."""
    for name, value in (
        ("exchange", message.exchange),
        ("routing key", message.routing_key),
        ("correlation_id", message.correlation_id),
        ("reply_to", message.reply_to),
    ):
        if value is not None and len(value.encode()) > MAX_SHORT_STRING:
            raise PublishError(f"message not sendable: {name} longer than {MAX_SHORT_STRING} bytes")
    if len(message.body) > MAX_MESSAGE_BYTES:
        raise PublishError(
            f"broker refused the message: body larger than {MAX_MESSAGE_BYTES} "
            f"bytes (max_message_size)"
        )
