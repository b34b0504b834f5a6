"""A broker that accepts connections and then says nothing (a restart behind a hung network)
makes pika time out the AMQP handshake, or lose the heartbeat of a connection that stalls
mid-stream. The role logs, backs off, keeps trying, and works again once the broker answers."""

from __future__ import annotations

import contextlib
import json
import logging
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import Engine, func, select

from sasflow.store.schema import runs
from sasflow.submitter import Submitter
from sasflow.transport.connection import BrokerOptions
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names, declare_common
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration

STACK_TIMEOUT_S = 1.0
"""pika's bound on one connection attempt (TCP, AMQP handshake, channel); 15 s by default."""


class StallingProxy:
    """A TCP proxy on 127.0.0.1 to the test broker that, while `stalled`, forwards nothing:
    new connections are accepted and left unanswered, open ones stop moving bytes."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self.stalled = threading.Event()
        self.accepted = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stalling-proxy", daemon=True)

    def __enter__(self) -> StallingProxy:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join(5)
        self._listener.close()

    def _run(self) -> None:
        peers: dict[socket.socket, socket.socket] = {}
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            try:
                while not self._done.is_set():
                    for key, _ in selector.select(timeout=0.05):
                        sock = key.fileobj
                        assert isinstance(sock, socket.socket)
                        if sock is self._listener:
                            self._accept(selector, peers)
                        elif sock in peers and not self.stalled.is_set():  # not closed just now
                            self._forward(sock, peers, selector)
                    if self.stalled.is_set():
                        time.sleep(0.05)  # readable sockets stay readable: do not spin
            finally:
                for sock in peers:
                    sock.close()

    def _accept(
        self, selector: selectors.BaseSelector, peers: dict[socket.socket, socket.socket]
    ) -> None:
        client, _ = self._listener.accept()
        self.accepted += 1
        try:
            upstream = socket.create_connection(self._target, timeout=5)
        except OSError:
            client.close()
            return
        for sock, other in ((client, upstream), (upstream, client)):
            sock.setblocking(False)
            peers[sock] = other
            selector.register(sock, selectors.EVENT_READ)

    @staticmethod
    def _forward(
        sock: socket.socket,
        peers: dict[socket.socket, socket.socket],
        selector: selectors.BaseSelector,
    ) -> None:
        other = peers[sock]
        try:
            data = sock.recv(65536)
            if data:
                other.setblocking(True)
                other.sendall(data)
                other.setblocking(False)
                return
        except OSError:
            pass
        for end in (sock, other):  # closed or broken: close both ends
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(end)
            peers.pop(end, None)
            end.close()


def _broker_address() -> tuple[str, int]:
    parts = urlsplit(services.broker_url())
    return parts.hostname or "localhost", parts.port or 5672


def _through(proxy: StallingProxy) -> str:
    parts = urlsplit(services.broker_url())
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@127.0.0.1:{proxy.port}" if credentials else f"127.0.0.1:{proxy.port}"
    query = "&".join(q for q in (parts.query, f"stack_timeout={STACK_TIMEOUT_S}") if q)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _runs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(runs)).scalar_one())


@contextlib.contextmanager
def _declared(names: Names) -> Iterator[None]:
    """The namespace's queues, declared directly on the broker, so submissions wait there."""
    transport = harness.transport("setup")
    transport.connect()
    try:
        declare_common(transport, names)
        yield
    finally:
        transport.close()


def _submit(names: Names, key: str) -> None:
    body = {"workflow": "pipeline", "key": key, "input": {"text": key}}
    harness.publish_raw(names.submit, json.dumps(body).encode())


def test_a_role_survives_a_broker_that_stalls_in_the_handshake_and_mid_stream(
    engine: Engine, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sasflow")
    with StallingProxy(_broker_address()) as proxy, _declared(names):
        proxy.stalled.set()
        transport = RabbitMQTransport(
            _through(proxy), process_name="test-submitter", options=BrokerOptions(heartbeat=1)
        )
        role = Submitter(engine, transport, basic.registry, names)
        with harness.running(role):
            # Handshake timeouts, one after the other, each followed by a pause.
            harness.wait_for(lambda: proxy.accepted >= 3, timeout=15, what="three attempts")
            retries = [
                r.getMessage() for r in caplog.records if "reconnecting in" in r.getMessage()
            ]
            assert any("Timeout during AMQP handshake" in m for m in retries), retries
            _submit(names, "after-handshake-stall")
            proxy.stalled.clear()
            harness.wait_for(lambda: _runs(engine) == 1, timeout=15, what="the first run")

            # Connected, then the broker goes silent: the heartbeat notices, the role reconnects.
            # (pika checks every heartbeat + 5 s: 6 to 12 s with the shortest heartbeat, 1 s.)
            caplog.clear()
            accepted = proxy.accepted
            proxy.stalled.set()
            harness.wait_for(
                lambda: proxy.accepted > accepted, timeout=20, what="a reconnection attempt"
            )
            _submit(names, "after-mid-stream-stall")
            proxy.stalled.clear()
            harness.wait_for(lambda: _runs(engine) == 2, timeout=20, what="the second run")
    assert (role.stats.created, role.stats.dead_lettered) == (2, 0)
