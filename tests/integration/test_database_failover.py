"""After a failover the roles find the new primary without a restart: a connection left on a
server that refuses writes is discarded (not retried for ever), a multi-host URL of either form
reaches the writable server for the pool and for the LISTEN connection, and a LISTEN
connection that stops answering is replaced within seconds.

A read-only server is played by this test's own database with `default_transaction_read_only`
(sessions keep the setting they started with, as sessions on a standby stay read-only); the
dead first host of a multi-host URL by a closed local port. Nothing else on the server is
touched."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from sasflow.errors import StoreUnavailableError
from sasflow.store import listen
from sasflow.store.cluster.lease import Lease
from sasflow.store.db import make_engine, transaction
from sasflow.store.listen import ReadyListener, libpq_dsn
from sasflow.store.notify import notify_ready
from tests import harness, services
from tests.chaos.instances import free_port
from tests.proxy import Proxy

pytestmark = pytest.mark.integration

APP = "sasflow-test"
"""The `engine` fixture's application_name: its sessions in pg_stat_activity."""


@contextlib.contextmanager
def _admin() -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(libpq_dsn(services.admin_url()), autocommit=True) as admin:
        yield admin


def _database(url: str) -> str:
    return make_url(url).database or ""


def _read_only(admin: psycopg.Connection[tuple[object, ...]], database: str, on: bool) -> None:
    """New sessions of `database` start read-only (`on`) or writable; open ones keep theirs."""
    name = sql.Identifier(database)
    if on:
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(name)
        )
    else:
        admin.execute(sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(name))


def _sessions(admin: psycopg.Connection[tuple[object, ...]], database: str) -> set[int]:
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
        (database, APP),
    ).fetchall()
    return {int(str(pid)) for (pid,) in rows}


def _end_sessions(admin: psycopg.Connection[tuple[object, ...]], database: str) -> None:
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = %s AND pid <> pg_backend_pid()",
        (database,),
    )


def _write(engine: Engine, name: str) -> None:
    """A write through the store (its transaction boundary translates the errors)."""
    assert Lease("failover-test", name=name, ttl=600).acquire(engine)


def _hold_connections(engine: Engine, count: int) -> None:
    """Open `count` pooled connections at once (reading only) and give them back."""
    with contextlib.ExitStack() as stack:
        for _ in range(count):
            stack.enter_context(engine.connect()).execute(text("SELECT 1"))


def test_a_connection_on_a_read_only_server_is_discarded_for_a_writable_one(
    engine: Engine, admin_database_url: str
) -> None:
    """A write refused by a read-only session raises StoreUnavailableError (what the roles
    retry) and closes that session. Once the database is writable again, with the same engine
    and although nobody ended the read-only sessions (pool_pre_ping accepts them), at most one
    more write is refused: that refusal discards every session the pool opened before it."""
    database = _database(admin_database_url)
    _write(engine, "before")
    with _admin() as admin:
        try:
            _read_only(admin, database, on=True)
            _end_sessions(admin, database)
            _hold_connections(engine, 3)
            harness.wait_for(lambda: len(_sessions(admin, database)) == 3, what="3 sessions")
            before = _sessions(admin, database)
            with pytest.raises(StoreUnavailableError, match="read-only transaction") as raised:
                _write(engine, "during")
            cause = raised.value.__cause__
            assert isinstance(cause, DBAPIError)
            assert cause.connection_invalidated
            harness.wait_for(
                lambda: len(before - _sessions(admin, database)) == 1,
                timeout=5,
                what="the session that refused the write closed",
            )
            # Read-only sessions opened after that failure, as a role's reads would.
            _hold_connections(engine, 2)
        finally:
            _read_only(admin, database, on=False)
        failures, recovered = _write_as_a_role_does(engine, writes=8)
        print(f"first write {recovered:.2f}s after the flip; {failures} refused")
        assert failures <= 1


def _write_as_a_role_does(engine: Engine, writes: int) -> tuple[int, float]:
    """`writes` writes, each retried after StoreUnavailableError (0.1 s apart, at most 10
    times): how many attempts were refused, and how long the first write took."""
    started = time.monotonic()
    first = None
    failures = 0
    for i in range(writes):
        for _attempt in range(10):
            try:
                _write(engine, f"after-{i}")
                break
            except StoreUnavailableError:
                failures += 1
                time.sleep(0.1)
        else:
            pytest.fail(f"write {i} refused 10 times: the pool keeps its read-only sessions")
        first = first or time.monotonic() - started
    return failures, first or 0.0


def _multi_host_url(url: str, form: str) -> str:
    """`url` with a closed local port as its first host and its own server second."""
    parsed = make_url(url)
    host, port, closed = parsed.host or "127.0.0.1", parsed.port or 5432, free_port()
    hosts: dict[str, str | list[str]] = (
        {"host": [f"127.0.0.1:{closed}", f"{host}:{port}"]}
        if form == "repeated"
        else {"host": f"127.0.0.1,{host}", "port": f"{closed},{port}"}
    )
    multi = parsed.set(host=None, port=None).update_query_dict(hosts)
    return multi.render_as_string(hide_password=False)


class _Wakeups:
    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.count += 1


def _notify(engine: Engine, namespace: str) -> None:
    with transaction(engine) as conn:
        notify_ready(conn, namespace)


@pytest.mark.parametrize("form", ["repeated", "comma"])
def test_a_multi_host_url_whose_first_host_is_down_reaches_the_second(
    database_url: str, form: str
) -> None:
    """Both forms (`?host=h1:p1&host=h2:p2`, `?host=h1,h2&port=p1,p2`) work for the pool
    (a write) and for the LISTEN connection (a NOTIFY reaches it)."""
    url = _multi_host_url(database_url, form)
    real_port = make_url(database_url).port or 5432
    engine = make_engine(url, application_name=APP)
    namespace = services.unique("sfmh")
    wakeups = _Wakeups()
    listener = ReadyListener(url, namespace, wakeups, name="multi-host")
    try:
        _write(engine, "multi-host")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT inet_server_port()")).scalar_one() == real_port
        listener.start()
        harness.wait_for(lambda: wakeups.count == 1, timeout=15, what="listener connected")
        _notify(engine, namespace)
        harness.wait_for(lambda: wakeups.count == 2, timeout=5, what="the NOTIFY delivered")
        assert listener.connections == 1
    finally:
        listener.stop()
        engine.dispose()


class _FreezingProxy(Proxy):
    """A Proxy whose `freeze` stops forwarding on the connections open now, keeping their
    sockets open (the kernel still acknowledges what the client sends: keepalives succeed):
    a server that stopped answering. Connections opened later are forwarded."""

    def __init__(self, backend: int) -> None:
        super().__init__(backend)
        self._frozen: set[socket.socket] = set()

    def freeze(self) -> None:
        with self._lock:
            self._frozen.update(self._sockets)

    def _pump(self, source: socket.socket, sink: socket.socket, split: bool) -> None:
        del split  # never re-chunked
        try:
            while data := source.recv(65536):
                with self._lock:
                    frozen = source in self._frozen
                if frozen:
                    self._stop.wait()
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def test_a_listen_connection_that_stops_answering_is_replaced_within_seconds(
    engine: Engine, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The liveness probe notices a server that accepts bytes but never answers (TCP
    keepalives do not: the peer's kernel acknowledges them), and the listener connects again
    and hears the next NOTIFY. Probe interval and timeout are 1 s here (5 s each shipped)."""
    monkeypatch.setattr(listen, "PROBE_INTERVAL", 1.0)
    monkeypatch.setattr(listen, "PROBE_TIMEOUT", 1.0)
    parsed = make_url(database_url)
    namespace = services.unique("sfprobe")
    wakeups = _Wakeups()
    proxy = _FreezingProxy(parsed.port or 5432)
    with proxy:
        url = parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        listener = ReadyListener(url, namespace, wakeups, name="probe")
        listener.start()
        try:
            harness.wait_for(lambda: wakeups.count == 1, timeout=15, what="listener connected")
            proxy.freeze()
            frozen = time.monotonic()
            harness.wait_for(
                lambda: listener.connections == 2, timeout=10, what="a new LISTEN connection"
            )
            replaced = time.monotonic() - frozen
            print(f"LISTEN connection replaced {replaced:.2f}s after the freeze")
            assert replaced < 4.0
            harness.wait_for(lambda: wakeups.count == 2, timeout=5, what="catch-up wake-up")
            _notify(engine, namespace)
            harness.wait_for(lambda: wakeups.count == 3, timeout=5, what="the NOTIFY delivered")
        finally:
            listener.stop()
