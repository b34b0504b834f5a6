"""One blocking connection to the broker for the operator's commands that inspect or change
queues by name (`sasflow queues migrate`, `sasflow namespace delete`): the first broker of the
list that answers, and a channel per call, since a 404 or a 406 closes the channel, not the
connection."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from sasflow.errors import ConfigurationError
from sasflow.transport.connection import BrokerOptions, broker_parameters

NOT_FOUND = 404


@dataclass(frozen=True)
class QueueState:
    messages: int
    consumers: int


class BrokerAdmin:
    """Use in a `with` block: connects on entry, closes on exit."""

    def __init__(self, url: str, options: BrokerOptions) -> None:
        self._params = broker_parameters(url, options)
        self._connection: pika.BlockingConnection | None = None

    def __enter__(self) -> BrokerAdmin:
        last: Exception | None = None
        for params in self._params:
            try:
                self._connection = pika.BlockingConnection(params)
            except pika.exceptions.AMQPError as exc:
                last = exc
            else:
                return self
        raise ConfigurationError(f"no broker of the list could be reached: {last!r}")

    def __exit__(self, *exc_info: object) -> None:
        if self._connection is not None and self._connection.is_open:
            self._connection.close()

    def queue_state(self, name: str) -> QueueState | None:
        """Messages and consumers of queue `name`, or None if it does not exist."""
        try:
            with self.channel() as ch:
                ok = ch.queue_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == NOT_FOUND:
                return None
            raise
        return QueueState(int(ok.method.message_count or 0), int(ok.method.consumer_count or 0))

    def consumers(self, name: str) -> int | None:
        """Consumers of queue `name`, or None if it does not exist."""
        state = self.queue_state(name)
        return None if state is None else state.consumers

    def exchange_exists(self, name: str) -> bool:
        try:
            with self.channel() as ch:
                ch.exchange_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == NOT_FOUND:
                return False
            raise
        return True

    @contextlib.contextmanager
    def channel(self) -> Iterator[BlockingChannel]:
        """A channel of its own (a 404 or 406 closes the channel, not the connection)."""
        if self._connection is None:
            raise RuntimeError(f"{type(self).__name__} is used outside its `with` block")
        channel = self._connection.channel()
        try:
            yield channel
        finally:
            if channel.is_open:
                channel.close()
