"""W0's RabbitMQ request/reply yardstick: the best a pika client does at sasflow's durability.

Durable request and reply queues, persistent messages, publisher confirms on both sides; the
echo server acks a request only after the broker confirmed its reply, and the client acks each
reply. Both ends use pika's `SelectConnection`, so confirms are pipelined (a callback settles
them as they come) instead of a blocking wait per message: that is the cheapest way pika offers
to keep this durability. The client runs in the calling process and the echo server in a child
process (`python -m bench.roundtrip serve`), as sasflow's scheduler and agent are separate
processes: two Python processes, not two threads sharing one interpreter lock.

The client keeps `in_flight` requests outstanding: it publishes that many, then one more each
time a reply arrives (a round trip counts when its reply arrives), for a fixed time; replies
still outstanding then are awaited (bounded) so that the queues are empty when deleted. Those
outstanding requests are the only bound on what is in flight: the echo server's prefetch is
unlimited, so a request whose reply is sent but not yet confirmed (hence not yet acked) does
not hold back the next request. That overlap is what pipelined confirms buy; with a prefetch
of `in_flight` every reply awaiting its confirm would hold one of the slots, and at 1 in flight
the server could receive no request before the previous reply's confirm: a blocking wait per
message in all but name (measured: about a quarter fewer round trips at 1 in flight).
"""

from __future__ import annotations

import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import pika
from pika.channel import Channel
from pika.frame import Method
from pika.spec import Basic, BasicProperties

from tests import services

REPO = Path(__file__).resolve().parents[1]
MAX_OPS = 10_000_000
GRACE = 10.0
"""Seconds the client waits, beyond its measuring time, for outstanding replies and confirms."""
READY_TIMEOUT = 30.0
PERSISTENT = 2
SERVER_PREFETCH = 0
"""Unlimited (AMQP's 0): the client's outstanding requests bound the echo server's deliveries."""


@dataclass
class Roundtrips:
    rate: float
    """Round trips per second (replies received while measuring / measuring time)."""
    latencies: list[float] = field(default_factory=list)
    """Seconds from each request's publish to its reply's arrival."""

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000 if self.latencies else float("nan")


class RoundtripError(RuntimeError):
    pass


def _settled(pending: Collection[int], method: Basic.Ack | Basic.Nack) -> list[int]:
    """Publish sequence numbers settled by a confirm (with `multiple`, every one up to it)."""
    tag = int(method.delivery_tag or 0)
    if method.multiple:
        return [seq for seq in pending if seq <= tag]
    return [tag] if tag in pending else []


class _Peer:
    """A SelectConnection with one channel in confirm mode, consuming `queue` with manual acks
    and a prefetch of `prefetch`; `_consuming` runs once the broker has started the consumer."""

    def __init__(self, queue: str, prefetch: int) -> None:
        self._queue, self._prefetch = queue, prefetch
        self._channel: Channel | None = None
        self.error: BaseException | None = None
        self.connection = pika.SelectConnection(
            pika.URLParameters(services.broker_url()),
            on_open_callback=self._connected,
            on_open_error_callback=lambda _c, exc: self._fail(exc),
            on_close_callback=lambda _c, _exc: self.connection.ioloop.stop(),
        )

    def _chan(self) -> Channel:
        if self._channel is None:
            raise RoundtripError("no channel yet")
        return self._channel

    def _connected(self, connection: pika.connection.Connection) -> None:
        connection.channel(on_open_callback=self._opened)

    def _opened(self, channel: Channel) -> None:
        self._channel = channel
        channel.confirm_delivery(self._confirmed, callback=lambda _f: self._qos())

    def _qos(self) -> None:
        self._chan().basic_qos(prefetch_count=self._prefetch, callback=lambda _f: self._consume())

    def _consume(self) -> None:
        self._chan().basic_consume(
            self._queue, self._delivered, callback=lambda _f: self._consuming()
        )

    def _fail(self, exc: BaseException | str) -> None:
        self.error = self.error or (exc if isinstance(exc, BaseException) else RoundtripError(exc))
        if self.connection.is_open:
            self.connection.close()
        else:
            self.connection.ioloop.stop()

    def _consuming(self) -> None:
        raise NotImplementedError

    def _delivered(
        self, channel: Channel, method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        raise NotImplementedError

    def _confirmed(self, frame: Method[Basic.Ack | Basic.Nack]) -> None:
        raise NotImplementedError


class _Echo(_Peer):
    """The server: replies to every request, acks it once the reply is confirmed."""

    def __init__(self, requests: str) -> None:
        super().__init__(requests, SERVER_PREFETCH)
        self._pending: dict[int, int] = {}  # reply publish seq -> request delivery tag
        self._seq = 0

    def _consuming(self) -> None:
        print("ready", flush=True)

    def _delivered(
        self, channel: Channel, method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        channel.basic_publish(
            "", props.reply_to or "", body, BasicProperties(delivery_mode=PERSISTENT)
        )
        self._seq += 1
        self._pending[self._seq] = int(method.delivery_tag or 0)

    def _confirmed(self, frame: Method[Basic.Ack | Basic.Nack]) -> None:
        if isinstance(frame.method, Basic.Nack):
            self._fail("the broker nacked a reply")
            return
        for seq in _settled(self._pending, frame.method):
            self._chan().basic_ack(self._pending.pop(seq))


def serve(requests: str) -> None:
    """The echo server's process: serves until killed, or until the bench that started it is
    gone (it checks its parent every second, so a killed bench leaves no server behind)."""
    echo = _Echo(requests)
    parent = os.getppid()

    def orphaned() -> None:
        if os.getppid() != parent:
            echo._fail("the bench that started this server is gone")
        else:
            echo.connection.ioloop.call_later(1.0, orphaned)

    echo.connection.ioloop.call_later(1.0, orphaned)
    echo.connection.ioloop.start()
    if echo.error is not None:
        raise SystemExit(f"echo server stopped: {echo.error!r}")


class _Client(_Peer):
    """Keeps `in_flight` requests outstanding for `seconds`; counts replies as they arrive."""

    def __init__(self, requests: str, replies: str, in_flight: int, seconds: float) -> None:
        super().__init__(replies, in_flight)
        self._requests, self._in_flight, self._seconds = requests, in_flight, seconds
        self._props = BasicProperties(delivery_mode=PERSISTENT, reply_to=replies)
        self._sent: dict[int, float] = {}  # request number -> perf_counter at publish
        self._unconfirmed: set[int] = set()  # publish sequence numbers not yet confirmed
        self._number = 0
        self._started = 0.0
        self._measuring = False
        self._done = 0
        self._elapsed = 0.0
        self.latencies: list[float] = []

    def run(self) -> Roundtrips:
        self.connection.ioloop.call_later(self._seconds + GRACE + READY_TIMEOUT, self._timeout)
        self.connection.ioloop.start()
        if self.error is not None:
            raise self.error
        return Roundtrips(self._done / self._elapsed if self._elapsed else 0.0, self.latencies)

    def _timeout(self) -> None:
        self._fail(f"{len(self._sent)} replies still outstanding after the grace time")

    def _consuming(self) -> None:
        self._measuring = True
        self._started = time.perf_counter()
        self.connection.ioloop.call_later(self._seconds, self._end)
        for _ in range(self._in_flight):
            self._publish()

    def _publish(self) -> None:
        self._number += 1
        self._sent[self._number] = time.perf_counter()
        self._chan().basic_publish("", self._requests, str(self._number).encode(), self._props)
        self._unconfirmed.add(self._number)  # the channel's publish sequence number

    def _delivered(
        self, channel: Channel, method: Basic.Deliver, _props: BasicProperties, body: bytes
    ) -> None:
        arrived = time.perf_counter()
        channel.basic_ack(int(method.delivery_tag or 0))
        sent = self._sent.pop(int(body), None)
        if sent is None:
            return  # not one of ours (cannot happen on a fresh queue; ignored)
        if self._measuring:
            self._done += 1
            self.latencies.append(arrived - sent)
            if self._done < MAX_OPS:
                self._publish()
        self._maybe_finish()

    def _confirmed(self, frame: Method[Basic.Ack | Basic.Nack]) -> None:
        if isinstance(frame.method, Basic.Nack):
            self._fail("the broker nacked a request")
            return
        self._unconfirmed.difference_update(_settled(self._unconfirmed, frame.method))
        self._maybe_finish()

    def _end(self) -> None:
        self._measuring = False
        self._elapsed = time.perf_counter() - self._started
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if not self._measuring and not self._sent and not self._unconfirmed:
            self.connection.close()


def _declare(requests: str, replies: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(services.broker_url()))
    try:
        channel = connection.channel()
        for queue in (requests, replies):
            channel.queue_declare(queue, durable=True)
            channel.queue_purge(queue)
    finally:
        connection.close()


def _delete(requests: str, replies: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(services.broker_url()))
    try:
        channel = connection.channel()
        for queue in (requests, replies):
            channel.queue_delete(queue)
    finally:
        connection.close()


def _await_ready(server: subprocess.Popen[str]) -> None:
    if server.stdout is None:
        raise RoundtripError("the echo server's output is not a pipe")
    ready, _, _ = select.select([server.stdout], [], [], READY_TIMEOUT)
    line = server.stdout.readline().strip() if ready else ""
    if line != "ready":
        raise RoundtripError(f"the echo server did not start (exit code {server.poll()}): {line!r}")


def roundtrips(namespace: str, in_flight: int, seconds: float) -> Roundtrips:
    """Request/reply round trips with `in_flight` requests outstanding at any time."""
    requests, replies = f"{namespace}.rr.requests", f"{namespace}.rr.replies"
    _declare(requests, replies)
    server = subprocess.Popen(  # noqa: S603 - this module, run by the same interpreter
        [sys.executable, "-m", "bench.roundtrip", "serve", requests],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        _await_ready(server)
        return _Client(requests, replies, in_flight, seconds).run()
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
        _delete(requests, replies)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        raise SystemExit("usage: python -m bench.roundtrip serve REQUESTS_QUEUE")
    serve(sys.argv[2])
