"""The in-process broker: a MemoryBroker shared by roles running as threads of one process.

It reproduces what the roles rely on from RabbitMQ (docs/protocol.md, "In-process bus"): the
default, direct, topic and fanout exchanges; idempotent declarations (different arguments close
the channel with PRECONDITION_FAILED, as RabbitMQ does); dead-letter exchanges with `x-death`;
per-message expiration (at the head of the queue); `max_length` with drop-head; mandatory
publishing; per-consumer prefetch; tags per connection, `multiple` acks, and redelivery
(`redelivered=True`) of what a closed connection left unacked; a deleted queue cancels its
consumers, which `process` raises as ConsumerCancelledError. Nothing survives the process.

Every mutation happens under the broker's one lock; each connection waits on its own condition
of that lock, so a publish wakes exactly the consumers it concerns and nobody polls.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from sasflow.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    UnroutableError,
)
from sasflow.transport.base import Delivery, Outgoing
from sasflow.transport.memory.model import (
    EXCHANGE_KINDS,
    JSON,
    Channel,
    Consumer,
    Exchange,
    Message,
    Queue,
    Unacked,
    check_sendable,
    record_death,
    topic_matches,
)

log = logging.getLogger(__name__)


class ChannelClosedError(BrokerUnavailableError):
    """The broker closed the channel (like RabbitMQ's NOT_FOUND or PRECONDITION_FAILED)."""


class MemoryBroker:
    """Queues, exchanges and bindings shared by every MemoryTransport of one process.

    Create one per process and hand it to whoever builds the transports; there is no global
    instance. `disconnect_all` simulates an outage and `delete_queue` a queue deleted under
    its consumers, for tests of the reconnect paths.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._exchanges: dict[str, Exchange] = {}
        self._queues: dict[str, Queue] = {}
        self._channels: set[Channel] = set()
        self._reachable = True
        self._expiries: list[tuple[float, int, Queue, Message]] = []  # heap by expiry time
        self._sequence = itertools.count()

    # -- test hooks and introspection -------------------------------------------------------

    def disconnect_all(self, *, stay_down: bool = False) -> None:
        """Drop every connection (their unacked messages are requeued as redelivered): each
        transport raises BrokerUnavailableError until it calls `connect()` again, which also
        fails while `stay_down` holds (until `restore()`)."""
        with self._lock:
            self._reachable = not stay_down
            for channel in list(self._channels):
                self._close_channel(channel, "connection lost (simulated broker outage)")

    def restore(self) -> None:
        """Accept connections again after `disconnect_all(stay_down=True)`."""
        with self._lock:
            self._reachable = True

    def delete_queue(self, name: str) -> int:
        """Delete `name` as `rabbitmqctl delete_queue` does: its messages are gone (held unacked
        ones too, though acking them still works), its bindings too, and each consumer's
        connection raises ConsumerCancelledError from `process`. Returns the messages it held
        ready; a queue that does not exist is no error (as in RabbitMQ)."""
        with self._lock:
            queue = self._queues.pop(name, None)
            if queue is None:
                return 0
            for exchange in self._exchanges.values():
                for binding in [b for b in exchange.bindings if b[0] == name]:
                    del exchange.bindings[binding]
            for consumer in list(queue.consumers):
                self._remove_consumer(consumer)
                channel = consumer.channel
                channel.consumers.remove(consumer)
                channel.cancelled.append(name)
                channel.wake.notify()
            for message in queue.ready:
                message.queued = False
            dropped = len(queue.ready)
            queue.ready.clear()
            return dropped

    def depth(self, queue: str) -> int:
        """Messages ready in `queue` (not counting unacked ones), as `rabbitmqctl list_queues`."""
        with self._lock:
            self._expire_due(time.monotonic())
            return len(self._require_queue(None, queue).ready)

    # -- connections ------------------------------------------------------------------------

    def _open_channel(self, process_name: str, generation: int) -> Channel:
        with self._lock:
            if not self._reachable:
                raise BrokerUnavailableError("broker unavailable: in-process bus is down")
            channel = Channel(process_name, generation, threading.Condition(self._lock))
            self._channels.add(channel)
            return channel

    def _close(self, channel: Channel, reason: str) -> None:
        with self._lock:
            self._close_channel(channel, reason)

    def _close_channel(self, channel: Channel, reason: str) -> None:
        """Requeue what the channel holds unacked at the head of its queues, as redelivered."""
        if not channel.open:
            return
        channel.open, channel.closed_because = False, reason
        self._channels.discard(channel)
        for consumer in channel.consumers:
            self._remove_consumer(consumer)
        channel.consumers.clear()
        held, channel.unacked = list(channel.unacked.values()), {}
        channel.inbox.clear()
        channel.callbacks.clear()
        self._requeue(held)
        channel.wake.notify_all()

    def _requeue(self, held: Sequence[Unacked]) -> None:
        now = time.monotonic()
        by_queue: dict[str, list[Unacked]] = {}
        for item in held:
            if item.consumer is not None:
                item.consumer.unacked -= 1
            if self._queues.get(item.queue.name) is item.queue:  # else deleted: the message too
                by_queue.setdefault(item.queue.name, []).append(item)
        for items in by_queue.values():
            queue = items[0].queue
            for item in reversed(items):
                item.message.redelivered = True
                item.message.queued = True
                queue.ready.appendleft(item.message)
                self._schedule_expiry(queue, item.message)
            self._expire_head(queue, now)
            self._dispatch(queue, now)

    def _check(self, channel: Channel) -> None:
        if not channel.open:
            raise BrokerUnavailableError(
                f"not connected to the in-process bus: {channel.closed_because}"
            )

    def _channel_error(self, channel: Channel, reason: str) -> ChannelClosedError:
        """Close the channel, as RabbitMQ does on a channel error; the caller raises the result."""
        self._close_channel(channel, reason)
        return ChannelClosedError(f"broker unavailable: channel closed by the broker: {reason}")

    # -- declarations -----------------------------------------------------------------------

    def _declare_exchange(self, channel: Channel, name: str, kind: str) -> None:
        if kind not in EXCHANGE_KINDS:
            raise ConfigurationError(
                f"exchange kind {kind!r} is not supported by the in-process bus "
                f"(supported: {', '.join(EXCHANGE_KINDS)})"
            )
        with self._lock:
            self._check(channel)
            if not name or name.startswith("amq."):
                raise self._channel_error(
                    channel, f"ACCESS_REFUSED - exchange name {name!r} is reserved"
                )
            existing = self._exchanges.get(name)
            if existing is None:
                self._exchanges[name] = Exchange(name, kind)
            elif existing.kind != kind:
                raise self._channel_error(
                    channel,
                    f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange "
                    f"{name!r}: received {kind!r} but current is {existing.kind!r}",
                )

    def _declare_queue(
        self,
        channel: Channel,
        name: str,
        dead_letter_exchange: str | None,
        max_length: int | None,
        expires_ms: int | None = None,
    ) -> None:
        if not name:
            raise ConfigurationError("the in-process bus has no server-named queues")
        with self._lock:
            self._check(channel)
            existing = self._queues.get(name)
            if existing is None:
                self._queues[name] = Queue(name, dead_letter_exchange, max_length, expires_ms)
                return
            for arg, current, received in (
                ("x-dead-letter-exchange", existing.dead_letter_exchange, dead_letter_exchange),
                ("x-max-length", existing.max_length, max_length),
                ("x-expires", existing.expires_ms, expires_ms),
            ):
                if current != received:
                    raise self._channel_error(
                        channel,
                        f"PRECONDITION_FAILED - inequivalent arg {arg!r} for queue "
                        f"{name!r}: received {received!r} but current is {current!r}",
                    )

    def _bind(self, channel: Channel, queue: str, exchange: str, routing_key: str) -> None:
        with self._lock:
            self._check(channel)
            if not exchange:
                raise self._channel_error(
                    channel, "ACCESS_REFUSED - operation not permitted on the default exchange"
                )
            target = self._require_queue(channel, queue)
            self._require_exchange(channel, exchange).bindings[(target.name, routing_key)] = None

    def _require_queue(self, channel: Channel | None, name: str) -> Queue:
        queue = self._queues.get(name)
        if queue is None:
            reason = f"NOT_FOUND - no queue {name!r}"
            if channel is None:
                raise ConfigurationError(reason)
            raise self._channel_error(channel, reason)
        return queue

    def _require_exchange(self, channel: Channel, name: str) -> Exchange:
        exchange = self._exchanges.get(name)
        if exchange is None:
            raise self._channel_error(channel, f"NOT_FOUND - no exchange {name!r}")
        return exchange

    # -- publishing and routing -------------------------------------------------------------

    def _publish(self, channel: Channel, message: Outgoing) -> None:
        check_sendable(message)
        headers = copy.deepcopy(dict(message.headers)) if message.headers else {}
        expiration = None if message.expiration_ms is None else max(message.expiration_ms, 1)
        with self._lock:
            self._check(channel)
            now = time.monotonic()
            self._expire_due(now)
            if message.exchange:
                targets = self._route(
                    self._require_exchange(channel, message.exchange), message.routing_key
                )
            else:
                queue = self._queues.get(message.routing_key)
                targets = [] if queue is None else [queue]
            if not targets:
                if message.mandatory:
                    raise UnroutableError(
                        f"broker refused the message: NO_ROUTE (exchange {message.exchange!r}, "
                        f"routing key {message.routing_key!r})"
                    )
                return  # RabbitMQ drops an unroutable message that is not mandatory
            for queue in targets:
                self._enqueue(
                    queue,
                    Message(
                        message.exchange,
                        message.routing_key,
                        bytes(message.body),
                        copy.deepcopy(headers),
                        expiration,
                        message.correlation_id,
                        message.reply_to,
                    ),
                    now,
                )

    def _route(self, exchange: Exchange, routing_key: str) -> list[Queue]:
        names: dict[str, None] = {}  # a queue bound several ways gets one copy
        for queue, key in exchange.bindings:
            if (
                exchange.kind == "fanout"
                or (exchange.kind == "direct" and key == routing_key)
                or (exchange.kind == "topic" and topic_matches(key, routing_key))
            ):
                names[queue] = None
        return [self._queues[name] for name in names if name in self._queues]

    def _enqueue(self, queue: Queue, message: Message, now: float) -> None:
        if message.expiration_ms is not None:
            message.expires_at = now + message.expiration_ms / 1000
        message.queued = True
        queue.ready.append(message)
        self._schedule_expiry(queue, message)
        if queue.max_length is not None:
            while len(queue.ready) > queue.max_length:
                self._dead_letter(queue, queue.ready.popleft(), "maxlen", now)
            self._expire_head(queue, now)
        self._dispatch(queue, now)

    # -- expiry and dead letters ------------------------------------------------------------

    def _schedule_expiry(self, queue: Queue, message: Message) -> None:
        if message.expires_at is not None:
            heapq.heappush(
                self._expiries, (message.expires_at, next(self._sequence), queue, message)
            )

    def _next_expiry(self) -> float | None:
        """When the next message still queued expires (entries of consumed ones are dropped, so
        waiting threads do not wake for them)."""
        while self._expiries and not self._expiries[0][3].queued:
            heapq.heappop(self._expiries)
        return self._expiries[0][0] if self._expiries else None

    def _expire_due(self, now: float) -> None:
        while (due := self._next_expiry()) is not None and due <= now:
            _, _, queue, _ = heapq.heappop(self._expiries)
            self._expire_head(queue, now)

    def _expire_head(self, queue: Queue, now: float) -> None:
        """Like RabbitMQ, a message expires once it reaches the head of its queue."""
        while (
            queue.ready
            and (expires_at := queue.ready[0].expires_at) is not None
            and expires_at <= now
        ):
            self._dead_letter(queue, queue.ready.popleft(), "expired", now)

    def _dead_letter(self, queue: Queue, message: Message, reason: str, now: float) -> None:
        """Republish to the queue's dead-letter exchange with RabbitMQ's `x-death` headers."""
        message.queued = False
        exchange = self._exchanges.get(queue.dead_letter_exchange or "")
        if exchange is None:
            if queue.dead_letter_exchange is not None:
                log.warning(
                    "dead letter from %s dropped: no exchange %r",
                    queue.name,
                    queue.dead_letter_exchange,
                )
            return
        headers = record_death(message, queue.name, reason)
        dead = replace(
            message,
            exchange=exchange.name,
            headers=headers,
            expiration_ms=None,
            expires_at=None,
            redelivered=False,
            queued=False,
        )
        seen = {d.get("queue") for d in headers["x-death"]}
        for target in self._route(exchange, message.routing_key):
            if target.name in seen:  # RabbitMQ drops dead-letter cycles
                log.warning(
                    "dead letter from %s not routed back to %s (cycle)", queue.name, target.name
                )
                continue
            self._enqueue(target, replace(dead, headers=copy.deepcopy(headers)), now)

    # -- consuming --------------------------------------------------------------------------

    def _consumer_count(self, channel: Channel, queue: str) -> int:
        with self._lock:
            self._check(channel)
            return len(self._require_queue(channel, queue).consumers)

    def _message_count(self, channel: Channel, queue: str) -> int:
        with self._lock:
            self._check(channel)
            return len(self._require_queue(channel, queue).ready)

    def _consume(
        self, channel: Channel, queue: str, handler: Callable[[Delivery], None], prefetch: int
    ) -> None:
        with self._lock:
            self._check(channel)
            target = self._require_queue(channel, queue)
            consumer = Consumer(channel, target, handler, prefetch)
            target.consumers.append(consumer)
            channel.consumers.append(consumer)
            self._dispatch(target, time.monotonic())

    def _cancel_consumers(self, channel: Channel, queue: str | None = None) -> None:
        """Stop delivering (from `queue` only, when given); deliveries not yet handed to a
        handler go back (redelivered)."""
        with self._lock:
            self._check(channel)
            stopped = [c for c in channel.consumers if queue is None or c.queue.name == queue]
            for consumer in stopped:
                self._remove_consumer(consumer)
                channel.consumers.remove(consumer)
            if queue is None:
                channel.cancelled.clear()  # consuming stops anyway
            undelivered = [(c, d) for c, d in channel.inbox if c in stopped]
            pending = [channel.unacked.pop(d.tag) for _, d in undelivered]
            kept = [(c, d) for c, d in channel.inbox if c not in stopped]
            channel.inbox.clear()
            channel.inbox.extend(kept)
            self._requeue(pending)

    def _remove_consumer(self, consumer: Consumer) -> None:
        consumer.active = False
        consumer.queue.consumers.remove(consumer)

    def _dispatch(self, queue: Queue, now: float) -> None:
        """Push ready messages to consumers with room, round-robin (as RabbitMQ does)."""
        while queue.ready:
            consumer = self._next_consumer(queue)
            if consumer is None:
                return
            self._expire_head(queue, now)
            if not queue.ready:
                return
            channel = consumer.channel
            delivery = self._hand_out(channel, queue, queue.ready.popleft(), consumer)
            channel.inbox.append((consumer, delivery))
            channel.wake.notify()
        self._expire_head(queue, now)

    def _next_consumer(self, queue: Queue) -> Consumer | None:
        count = len(queue.consumers)
        for offset in range(count):
            consumer = queue.consumers[(queue.turn + offset) % count]
            if consumer.has_room():
                queue.turn = (queue.turn + offset + 1) % count
                return consumer
        return None

    def _hand_out(
        self, channel: Channel, queue: Queue, message: Message, consumer: Consumer | None
    ) -> Delivery:
        message.queued = False
        tag = next(channel.tags)
        channel.unacked[tag] = Unacked(message, queue, consumer)
        if consumer is not None:
            consumer.unacked += 1
        return Delivery(
            tag=tag,
            body=message.body,
            queue=queue.name,
            generation=channel.generation,
            redelivered=message.redelivered,
            headers=copy.deepcopy(message.headers),
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            content_type=JSON,
        )

    def _get(self, channel: Channel, queue: str) -> Delivery | None:
        with self._lock:
            self._check(channel)
            now = time.monotonic()
            self._expire_due(now)
            target = self._require_queue(channel, queue)
            self._expire_head(target, now)
            if not target.ready:
                return None
            delivery = self._hand_out(channel, target, target.ready.popleft(), None)
            self._expire_head(target, now)
            return delivery

    def _ack(self, channel: Channel, tag: int, multiple: bool) -> None:
        with self._lock:
            self._check(channel)
            if multiple and tag == 0:
                tags = list(channel.unacked)
            elif tag not in channel.unacked:
                raise self._channel_error(
                    channel, f"PRECONDITION_FAILED - unknown delivery tag {tag}"
                )
            else:
                tags = [t for t in channel.unacked if t <= tag] if multiple else [tag]
            freed: dict[str, Queue] = {}
            for done in tags:
                item = channel.unacked.pop(done)
                if item.consumer is not None:
                    item.consumer.unacked -= 1
                    if item.consumer.active:
                        freed[item.queue.name] = item.queue
            now = time.monotonic()
            for queue in freed.values():
                self._dispatch(queue, now)

    def _nack(self, channel: Channel, tag: int) -> None:
        """basic.nack with requeue: the message goes back to the head of its queue."""
        with self._lock:
            self._check(channel)
            if tag not in channel.unacked:
                raise self._channel_error(
                    channel, f"PRECONDITION_FAILED - unknown delivery tag {tag}"
                )
            self._requeue([channel.unacked.pop(tag)])

    # -- the owner thread's loop ------------------------------------------------------------

    def _call_threadsafe(self, channel: Channel, callback: Callable[[], None]) -> None:
        with self._lock:
            self._check(channel)
            channel.callbacks.append(callback)
            channel.wake.notify()

    def _wait(self, channel: Channel, deadline: float) -> int:
        """Wait until the channel has work or `deadline`; how many items are pending."""
        with self._lock:
            while True:
                self._check(channel)
                now = time.monotonic()
                self._expire_due(now)
                pending = len(channel.callbacks) + len(channel.inbox)
                if pending or channel.cancelled or now >= deadline:
                    return pending
                # Wake to expire messages even if nobody else calls the broker.
                expiry = self._next_expiry()
                until = deadline if expiry is None else min(deadline, expiry)
                channel.wake.wait(until - now)

    def _next_work(self, channel: Channel) -> Callable[[], None] | None:
        with self._lock:
            self._check(channel)
            if channel.callbacks:
                return channel.callbacks.popleft()
            if channel.inbox:
                consumer, delivery = channel.inbox.popleft()
                return partial(consumer.handler, delivery)
            return None

    def _take_cancelled(self, channel: Channel) -> tuple[str, ...]:
        with self._lock:
            cancelled = tuple(channel.cancelled)
            channel.cancelled.clear()
            return cancelled
