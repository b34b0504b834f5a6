"""The Transport port on RabbitMQ with pika's BlockingConnection (one owner thread)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from pika.adapters.utils import connection_workflow
from pika.channel import Channel
from pika.exchange_type import ExchangeType
from pika.frame import Method
from pika.spec import Basic, BasicProperties

from sasflow.errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    ConsumerCancelledError,
    PublishError,
)
from sasflow.redact import redact_url
from sasflow.transport import topology
from sasflow.transport.base import Delivery, Outgoing, PublishTicket
from sasflow.transport.brokers import broker_urls, connect_order
from sasflow.transport.confirms import ConfirmTracker
from sasflow.transport.connection import BrokerOptions, broker_parameters
from sasflow.transport.queues import queue_arguments, type_mismatch

log = logging.getLogger(__name__)

PERSISTENT = 2
PRECONDITION_FAILED = 406
JSON = "application/json"
CONSUMER_SIDE = ("delivery acknowledgement on channel", "unknown delivery tag")
"""PRECONDITION_FAILED texts about the channel's consumer side, not a message it publishes: a
delivery left unacknowledged past the broker's consumer timeout, an ack of a tag it does not
know. The messages awaiting their confirms then are sent again on the next connection."""


MESSAGE_REFUSED: tuple[type[Exception], ...] = (
    pika.exceptions.UnroutableError,
    pika.exceptions.NackError,
    # Raised while encoding a frame, before a byte is sent: this message (or name) cannot be
    # carried by AMQP at all, so reconnecting would only fail the same way.
    pika.exceptions.ShortStringTooLong,
    pika.exceptions.BodyTooLongError,
    pika.exceptions.UnsupportedAMQPFieldException,
)
"""The broker, or AMQP itself, refuses this one message: PublishError (the caller fails or
reports that message; the connection is fine)."""

PROGRAMMING_ERRORS: tuple[type[Exception], ...] = (
    pika.exceptions.DuplicateConsumerTag,
    pika.exceptions.ChannelError,  # the base of DuplicateGetOkCallback only
    pika.exceptions.ReentrancyError,
    pika.exceptions.InvalidChannelNumber,
)
"""pika's checks of how it is called, raised before anything reaches the network: a bug in
sasflow, which a reconnect would repeat forever. Not translated, so it ends the role loudly."""

BROKER_FAILURES: tuple[type[BaseException], ...] = (
    pika.exceptions.AMQPError,
    # Raised by BlockingConnection() as they are (only socket-connect and phase errors are
    # unwrapped), e.g. AMQPConnectorStackTimeout, "Timeout during AMQP handshake".
    connection_workflow.AMQPConnectorException,
    OSError,
)
"""Every other failure to reach or talk to the broker: BrokerUnavailableError (reconnect with
backoff). That includes a channel or connection the broker closed, a heartbeat or handshake
timeout, a stream lost, refused credentials and frames that make no sense."""


REFUSED_CONNECTION: tuple[type[Exception], ...] = (
    pika.exceptions.ProbableAuthenticationError,  # 403 ACCESS_REFUSED at login
    pika.exceptions.ProbableAccessDeniedError,  # 530: no such virtual host, or no access to it
    pika.exceptions.AuthenticationError,  # no mechanism both ends support
)
"""The broker refused this process's credentials or virtual host: BrokerRefusedError."""

ACCESS_REFUSED = 403


def _refused(exc: Exception) -> bool:
    if isinstance(exc, REFUSED_CONNECTION):
        return True
    # A user without permission on a name (configure, write or read) has its channel closed.
    return isinstance(exc, pika.exceptions.ChannelClosedByBroker) and (
        exc.reply_code == ACCESS_REFUSED
    )


def _refuses_message(exc: pika.exceptions.ChannelClosedByBroker) -> bool:
    """Whether the broker closed the channel over a message published on it (e.g. one larger
    than its max_message_size), not over its consumer side (CONSUMER_SIDE)."""
    text = str(exc.reply_text)
    return exc.reply_code == PRECONDITION_FAILED and not any(t in text for t in CONSUMER_SIDE)


@contextlib.contextmanager
def _translated(*, never_connected: bool = False, tried: str = "") -> Iterator[None]:
    """Translate pika's errors; `tried` (the broker list, passwords hidden) ends the message of
    a failed connect."""
    suffix = f" (tried {tried})" if tried else ""
    try:
        yield
    except PROGRAMMING_ERRORS:
        raise
    except MESSAGE_REFUSED as exc:
        raise PublishError(f"broker refused the message: {exc!r}") from exc
    except BROKER_FAILURES as exc:
        if isinstance(exc, Exception) and _refused(exc):
            raise BrokerRefusedError(
                f"broker refused access: {exc!r}{suffix}", never_connected=never_connected
            ) from exc
        raise BrokerUnavailableError(f"broker unavailable: {exc!r}{suffix}") from exc


def _address(params: pika.connection.Parameters) -> tuple[str, int, str]:
    return (str(params.host), int(params.port), str(params.virtual_host))


def _impl(channel: BlockingChannel) -> Channel:
    """The asynchronous channel under a BlockingChannel: pika has no public API to settle a
    batch of confirms with one wait (written and tested against pika 1.4)."""
    impl: Channel = cast("Any", channel)._impl
    return impl


def _wait_until(channel: BlockingChannel, ready: Callable[[], bool]) -> None:
    """Process the connection's I/O until `ready()`; consumer deliveries are queued for the
    next `process_data_events`, never dispatched here. Raises if the channel closes."""
    cast("Any", channel)._flush_output(ready)


def _properties(message: Outgoing) -> BasicProperties:
    return BasicProperties(
        content_type=JSON,
        delivery_mode=PERSISTENT,
        headers=dict(message.headers) if message.headers else None,
        expiration=str(max(message.expiration_ms, 1))
        if message.expiration_ms is not None
        else None,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
    )


class RabbitMQTransport:
    """One BlockingConnection and one confirm-mode channel, reconnected by `connect()`."""

    def __init__(
        self, url: str, *, process_name: str, options: BrokerOptions | None = None
    ) -> None:
        options = options or BrokerOptions()
        self._params = broker_parameters(url, options)
        self._queues = options.queues
        for params in self._params:
            params.client_properties = {
                "connection_name": f"{process_name}@{socket.gethostname()}:{os.getpid()}"
            }
        self._shown = {
            _address(p): redact_url(u) for p, u in zip(self._params, broker_urls(url), strict=True)
        }
        self._url = redact_url(url)
        self._random = random.Random()  # noqa: S311 - spreads connections, guards nothing
        self._process_name = process_name
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._generation = 0
        self._declared = False
        self._tracker = ConfirmTracker()
        self._serial = False
        """After the broker closed the channel over one unknown message of a batch, the next
        batch is published one message at a time so that message gets its own error."""
        self._consumers: dict[str, str] = {}
        """Consumer tag -> queue, of the channel that watches for the broker's cancels."""
        self._watched: BlockingChannel | None = None
        self._cancelled: list[str] = []
        """Queues whose consumer the broker cancelled, raised by the next `process`."""

    @property
    def generation(self) -> int:
        return self._generation

    def _chan(self) -> BlockingChannel:
        if self._channel is None or not self._channel.is_open:
            raise BrokerUnavailableError(f"not connected to {self._url}")
        return self._channel

    def connect(self) -> None:
        self.close()
        with _translated(never_connected=self._generation == 0, tried=self._url):
            # pika tries the list in order (each `connection_attempts` times in all, with
            # `retry_delay` between rounds): a new order each time spreads the fleet's
            # connections and skips past a dead node on the next connect at the latest.
            self._connection = pika.BlockingConnection(connect_order(self._params, self._random))
            self._channel = self._connection.channel()
            self._tracker = self._enable_confirms(self._channel)
        self._generation += 1
        log.info("connected to broker %s (generation %d)", self.broker, self._generation)

    @property
    def broker(self) -> str:
        """The URL (password hidden) of the broker connected to, else the whole list."""
        connection = self._connection
        if connection is None:
            return self._url
        params = cast("Any", connection)._impl.params
        return self._shown.get(_address(params), self._url)

    @staticmethod
    def _enable_confirms(channel: BlockingChannel) -> ConfirmTracker:
        """Put `channel` in confirm mode with our own ack/nack and return callbacks.

        BlockingChannel.confirm_delivery() would wait for each message's confirm in turn; the
        underlying channel's callbacks let a whole batch be settled with one wait. They run
        on the owner thread while pika processes I/O.
        """
        tracker = ConfirmTracker()
        impl = _impl(channel)

        def on_confirm(frame: Method[Basic.Ack | Basic.Nack]) -> None:
            method = frame.method
            tracker.confirmed(
                int(method.delivery_tag),
                multiple=bool(method.multiple),
                nack=isinstance(method, Basic.Nack),
            )

        def on_return(
            _ch: Channel, method: Basic.Return, _props: BasicProperties, body: bytes
        ) -> None:
            tracker.returned(
                str(method.exchange),
                str(method.routing_key),
                body,
                f"{method.reply_code} {method.reply_text}",
            )

        selected: list[bool] = []
        impl.confirm_delivery(on_confirm, callback=lambda _frame: selected.append(True))
        _wait_until(channel, lambda: bool(selected))
        impl.add_on_return_callback(on_return)
        return tracker

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(Exception):  # closing a broken connection may fail anyhow
                connection.close()

    def _declaring(self) -> contextlib.AbstractContextManager[None]:
        # A user refused the namespace's names (403 on a declare) before any declare went
        # through has the same permanent misconfiguration as one refused at login.
        return _translated(never_connected=not self._declared)

    def declare_exchange(self, name: str, kind: str) -> None:
        with self._declaring():
            self._chan().exchange_declare(name, exchange_type=ExchangeType(kind), durable=True)
        self._declared = True

    def declare_queue(
        self,
        name: str,
        *,
        dead_letter_exchange: str | None,
        max_length: int | None = None,
        expires_ms: int | None = None,
        work: bool = False,
    ) -> None:
        arguments = queue_arguments(
            self._queues,
            work=work,
            dead_letter_exchange=dead_letter_exchange,
            max_length=max_length,
            expires_ms=expires_ms,
        )
        with self._declaring():
            self._declare_queue(name, arguments, work=work)
        self._declared = True

    def _declare_queue(self, name: str, arguments: dict[str, Any], *, work: bool) -> None:
        """Declare on a channel of its own, so that a work queue declared earlier with another
        type (queues.TYPE_ARGUMENTS) is used as it is, with a warning, without losing the
        channel; any other conflict is refused as always."""
        if self._connection is None or not self._connection.is_open:
            raise BrokerUnavailableError(f"not connected to {self._url}")
        side = self._connection.channel()
        try:
            side.queue_declare(name, durable=True, arguments=arguments)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if not (
                work and exc.reply_code == PRECONDITION_FAILED and type_mismatch(exc.reply_text)
            ):
                raise
            log.warning(
                "queue %s exists with other arguments than this process's queue type "
                "settings (%s): using it as it is; `sasflow queues migrate` moves a "
                "deployment to another queue type",
                name,
                exc.reply_text,
            )
            side = self._connection.channel()
            side.queue_declare(name, passive=True)
        finally:
            if side.is_open:
                side.close()

    def consumer_count(self, queue: str) -> int:
        with _translated():
            declared = self._chan().queue_declare(queue, passive=True)
        return int(declared.method.consumer_count or 0)

    def message_count(self, queue: str) -> int:
        with _translated():
            declared = self._chan().queue_declare(queue, passive=True)
        return int(declared.method.message_count or 0)

    def bind_queue(self, queue: str, exchange: str, routing_key: str) -> None:
        with self._declaring():
            self._chan().queue_bind(queue, exchange, routing_key=routing_key)
        self._declared = True

    def _delivery(
        self, queue: str, method: Basic.Deliver | Basic.GetOk, props: BasicProperties, body: bytes
    ) -> Delivery:
        return Delivery(
            tag=int(method.delivery_tag or 0),
            body=body,
            queue=queue,
            generation=self._generation,
            redelivered=bool(method.redelivered),
            headers=dict(props.headers or {}),
            correlation_id=props.correlation_id,
            reply_to=props.reply_to,
            content_type=props.content_type,
            message_id=props.message_id,
        )

    def consume(self, queue: str, handler: Callable[[Delivery], None], *, prefetch: int) -> None:
        def on_message(
            _ch: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes
        ) -> None:
            handler(self._delivery(queue, method, props, body))

        with _translated():
            channel = self._chan()
            self._watch_cancels(channel)
            channel.basic_qos(prefetch_count=prefetch)
            self._consumers[channel.basic_consume(queue, on_message, auto_ack=False)] = queue

    def _watch_cancels(self, channel: BlockingChannel) -> None:
        """Once per channel: note the consumers the broker cancels (RabbitMQ's Basic.Cancel,
        sent when the queue is deleted or its node is lost), so that `process` raises."""
        if self._watched is channel:
            return
        self._watched, self._consumers, self._cancelled = channel, {}, []

        def on_cancel(frame: Any) -> None:
            # pika calls this on the owner thread, from process_data_events, with the Method
            # frame (its stubs say the Basic.Cancel inside). A tag not found here is one that
            # `cancel_consumers` cancelled already.
            method = getattr(frame, "method", frame)
            queue = self._consumers.pop(str(method.consumer_tag), None)
            if queue is not None:
                self._cancelled.append(queue)

        channel.add_on_cancel_callback(on_cancel)

    def get(self, queue: str) -> Delivery | None:
        with _translated():
            method, props, body = self._chan().basic_get(queue, auto_ack=False)
        if method is None or props is None:
            return None
        return self._delivery(queue, method, props, body if isinstance(body, bytes) else b"")

    def cancel_consumers(self, queue: str | None = None) -> None:
        if queue is None:
            self._cancelled.clear()  # consuming stops: a cancel by the broker changes nothing
        if self._channel is None or not self._channel.is_open:
            return
        with _translated():
            for tag in list(self._channel.consumer_tags):
                if queue is None or self._consumers.get(tag) == queue:
                    self._channel.basic_cancel(tag)
                    self._consumers.pop(tag, None)

    def publish(self, message: Outgoing) -> None:
        (result,) = self.publish_many([message])
        if result is not None:
            raise result

    def publish_many(self, messages: Sequence[Outgoing]) -> list[Exception | None]:
        """Write every message, then wait once until the broker settled them all.

        Besides None and PublishError, an entry may be a BrokerUnavailableError: a message the
        broker nacked, or not sent as it closed the channel over an earlier one of the batch
        (then the connection must be made again, as for a raised BrokerUnavailableError).

        Pipelining the confirms is what makes a batch cheap: one persistent message costs a
        broker disk sync, and the broker syncs the messages of a batch together. The wait
        processes broker I/O only; consumer deliveries that arrive meanwhile are dispatched
        by the next `process`.
        """
        if not (self._serial and len(messages) > 1):
            return self._publish_batch(messages)
        results: list[Exception | None] = []
        for index, message in enumerate(messages):
            results.extend(self._publish_batch([message]))
            if results[-1] is not None and not self._chan_open():
                # The broker closed the channel on refusing this one: the rest was not sent
                # (the caller gives it back) and the next batch is published one by one too.
                unsent = BrokerUnavailableError(
                    "not sent: the broker closed the channel after refusing an earlier message"
                )
                return results + [unsent] * (len(messages) - index - 1)
        self._serial = False
        return results

    def publish_nowait(self, messages: Sequence[Outgoing]) -> PublishTicket:
        """Write every message and return without waiting for the confirms (`settled`)."""
        ticket = PublishTicket([None] * len(messages), {}, self._generation)
        try:
            with _translated():
                self._write(messages, ticket.results, ticket.tags)
        except BaseException:
            self._tracker.forget(list(ticket.tags.values()))
            raise
        return ticket

    def settled(self, ticket: PublishTicket, *, wait: bool) -> list[Exception | None] | None:
        """Confirms arrive while pika processes I/O (`process`, another batch's wait); with
        `wait`, process it here until they all have (consumer deliveries are not dispatched)."""
        if ticket.generation != self._generation or not self._chan_open():
            self._tracker.forget(list(ticket.tags.values()))
            raise BrokerUnavailableError(f"channel to {self._url} closed before the confirms")
        waiting = list(ticket.tags.values())
        if not self._tracker.is_settled(waiting):
            if not wait:
                return None
            try:
                with _translated():
                    self._await_confirms(ticket.results, ticket.tags)
            except BaseException:
                self._tracker.forget(waiting)
                raise
        for index, tag in ticket.tags.items():
            refused = self._tracker.take(tag)
            if refused is not None:
                ticket.results[index] = refused
        return ticket.results

    def forget(self, ticket: PublishTicket) -> None:
        self._tracker.forget(list(ticket.tags.values()))

    @property
    def confirms_tracked(self) -> int:
        """Messages of this channel whose confirms are awaited, or arrived and not taken yet
        (none once every batch was settled or forgotten)."""
        return self._tracker.tracked

    def _chan_open(self) -> bool:
        return self._channel is not None and self._channel.is_open

    def _publish_batch(self, messages: Sequence[Outgoing]) -> list[Exception | None]:
        results: list[Exception | None] = [None] * len(messages)
        tags: dict[int, int] = {}
        try:
            with _translated():
                self._write(messages, results, tags)
                self._await_confirms(results, tags)
        except BaseException:
            self._tracker.forget(list(tags.values()))
            raise
        for index, tag in tags.items():
            refused = self._tracker.take(tag)
            if refused is not None:
                results[index] = refused
        return results

    def _write(
        self, messages: Sequence[Outgoing], results: list[Exception | None], tags: dict[int, int]
    ) -> None:
        """Hand every message to the channel without waiting; `tags` maps index to tag."""
        impl = _impl(self._chan())
        for index, message in enumerate(messages):
            try:
                impl.basic_publish(
                    message.exchange,
                    message.routing_key,
                    message.body,
                    _properties(message),
                    mandatory=message.mandatory,
                )
            except (pika.exceptions.ShortStringTooLong, pika.exceptions.BodyTooLongError) as exc:
                # Raised while marshalling, before a byte is sent: no tag is used.
                results[index] = PublishError(f"message not sendable: {exc!r}")
                continue
            tags[index] = self._tracker.sent(
                message.exchange, message.routing_key, message.body, mandatory=message.mandatory
            )

    def _await_confirms(self, results: list[Exception | None], tags: dict[int, int]) -> None:
        """Process broker I/O until every tag is settled (deliveries wait for `process`)."""
        tracker, waiting = self._tracker, list(tags.values())
        try:
            _wait_until(self._chan(), lambda: tracker.is_settled(waiting))
        except pika.exceptions.ChannelClosedByBroker as exc:
            if not _refuses_message(exc):
                raise
            unsettled = [i for i, t in tags.items() if not tracker.is_settled([t])]
            if len(unsettled) != 1:
                # Which message of the batch the broker refused is unknown: publish the next
                # batch one message at a time to find it.
                self._serial = True
                raise
            results[unsettled[0]] = PublishError(f"broker refused the message: {exc.reply_text}")
            del tags[unsettled[0]]
        if not tracker.is_settled(list(tags.values())):
            raise BrokerUnavailableError(
                f"channel to {self._url} closed while waiting for publisher confirms"
            )

    def ack(self, delivery: Delivery, *, multiple: bool = False) -> bool:
        if delivery.generation != self._generation:
            return False
        with _translated():
            self._chan().basic_ack(delivery.tag, multiple=multiple)
        return True

    def requeue(self, delivery: Delivery) -> bool:
        if delivery.generation != self._generation:
            return False
        with _translated():
            self._chan().basic_nack(delivery.tag, requeue=True)
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
        if self._connection is None:
            raise BrokerUnavailableError(f"not connected to {self._url}")
        with _translated():
            # pika takes fractions of a second; the third-party stubs say int.
            self._connection.process_data_events(time_limit=time_limit)  # type: ignore[arg-type]
        if self._cancelled:
            # A consumer the broker cancelled is handled like a lost connection: the role
            # connects again, declares its queues and consumes them (docs/architecture.md).
            cancelled, self._cancelled = tuple(self._cancelled), []
            raise ConsumerCancelledError(cancelled)

    def call_threadsafe(self, callback: Callable[[], None]) -> None:
        connection = self._connection
        if connection is None:
            raise BrokerUnavailableError(f"not connected to {self._url}")
        with _translated():
            connection.add_callback_threadsafe(callback)
