"""The Transport port of one role on the in-process bus: a connection to a MemoryBroker (one
owner thread, like a pika connection), with the generation that fences its deliveries."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from sasflow.errors import (
    BrokerUnavailableError,
    ConsumerCancelledError,
    PublishError,
)
from sasflow.transport import topology
from sasflow.transport.base import Delivery, Outgoing
from sasflow.transport.memory.broker import MemoryBroker
from sasflow.transport.memory.model import Channel

log = logging.getLogger(__name__)


class MemoryTransport:
    """The Transport port on a MemoryBroker; owned by one thread, like RabbitMQTransport."""

    def __init__(self, broker: MemoryBroker, *, process_name: str) -> None:
        self._broker = broker
        self._process_name = process_name
        self._channel: Channel | None = None
        self._generation = 0

    @property
    def generation(self) -> int:
        return self._generation

    def _chan(self) -> Channel:
        channel = self._channel  # read once: call_threadsafe runs on other threads
        if channel is None:
            raise BrokerUnavailableError("not connected to the in-process bus")
        return channel

    def connect(self) -> None:
        self.close()
        self._channel = self._broker._open_channel(self._process_name, self._generation + 1)
        self._generation += 1
        log.info("connected to the in-process bus (generation %d)", self._generation)

    def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            self._broker._close(channel, "closed by the client")

    def declare_exchange(self, name: str, kind: str) -> None:
        self._broker._declare_exchange(self._chan(), name, kind)

    def declare_queue(
        self,
        name: str,
        *,
        dead_letter_exchange: str | None,
        max_length: int | None = None,
        expires_ms: int | None = None,
        work: bool = False,
    ) -> None:
        del work  # one process: no replication, no queue types
        self._broker._declare_queue(
            self._chan(), name, dead_letter_exchange, max_length, expires_ms
        )

    def bind_queue(self, queue: str, exchange: str, routing_key: str) -> None:
        self._broker._bind(self._chan(), queue, exchange, routing_key)

    def consumer_count(self, queue: str) -> int:
        return self._broker._consumer_count(self._chan(), queue)

    def message_count(self, queue: str) -> int:
        return self._broker._message_count(self._chan(), queue)

    def consume(self, queue: str, handler: Callable[[Delivery], None], *, prefetch: int) -> None:
        self._broker._consume(self._chan(), queue, handler, prefetch)

    def cancel_consumers(self, queue: str | None = None) -> None:
        if self._channel is not None and self._channel.open:
            self._broker._cancel_consumers(self._channel, queue)

    def get(self, queue: str) -> Delivery | None:
        return self._broker._get(self._chan(), queue)

    def publish(self, message: Outgoing) -> None:
        self._broker._publish(self._chan(), message)

    def publish_many(self, messages: Sequence[Outgoing]) -> list[Exception | None]:
        results: list[Exception | None] = []
        for message in messages:
            try:
                self.publish(message)
            except PublishError as exc:
                results.append(exc)
            else:
                results.append(None)
        return results

    def ack(self, delivery: Delivery, *, multiple: bool = False) -> bool:
        if delivery.generation != self._generation:
            return False
        self._broker._ack(self._chan(), delivery.tag, multiple)
        return True

    def requeue(self, delivery: Delivery) -> bool:
        if delivery.generation != self._generation:
            return False
        self._broker._nack(self._chan(), delivery.tag)
        return True

    def dead_letter(self, delivery: Delivery, reason: str, *, dead_letter_exchange: str) -> None:
        topology.dead_letter(
            self,
            delivery,
            reason,
            dead_letter_exchange=dead_letter_exchange,
            process_name=self._process_name,
        )

    def process(self, time_limit: float) -> None:
        channel = self._chan()
        pending = self._broker._wait(channel, time.monotonic() + max(0.0, time_limit))
        # Only what was pending when woken, so a steady stream cannot keep us here forever.
        for _ in range(pending):
            work = self._broker._next_work(channel)
            if work is None:
                break
            work()
        # After the deliveries that arrived before it, as pika dispatches a Basic.Cancel.
        if cancelled := self._broker._take_cancelled(channel):
            raise ConsumerCancelledError(cancelled)

    def call_threadsafe(self, callback: Callable[[], None]) -> None:
        self._broker._call_threadsafe(self._chan(), callback)
