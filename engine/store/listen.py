"""A thread that LISTENs for ready-work notifications and calls back on each wake-up."""

from __future__ import annotations

import logging
import selectors
import threading
import time
from collections.abc import Callable

import psycopg
from psycopg import pq, sql

from sasflow.runtime import Reconnect
from sasflow.store.cluster.schedules import channel as schedules_channel
from sasflow.store.db import EngineOptions, libpq_conninfo
from sasflow.store.flow.limits import channel as limits_channel
from sasflow.store.notify import channel

log = logging.getLogger(__name__)

PROBE_INTERVAL = 5.0
"""Seconds between liveness probes of the LISTEN connection. It only reads, so a socket the
server no longer answers on (a half-open connection, a frozen server) would wait for ever: the
probe's round trip, bounded by PROBE_TIMEOUT, finds it out."""

PROBE_TIMEOUT = 5.0
"""Seconds a probe may take before the connection is given up and opened again."""


def libpq_dsn(sqlalchemy_url: str) -> str:
    """The libpq connection string of a SQLAlchemy URL, naming the hosts and parameters the
    pool's connections use (see `db.libpq_conninfo`; password kept: not for logging)."""
    return libpq_conninfo(sqlalchemy_url)


class ProbeTimeoutError(psycopg.OperationalError):
    """The database did not answer the LISTEN connection's liveness probe in time."""


class ReadyListener:
    """Calls `on_ready` (from its own thread) whenever work is committed in the namespace (or
    a notification arrives on `channel_name` when given: the subscription stream's),
    `on_schedules`, when given, whenever its schedules or scheduler registry change, and
    `on_limits`, when given, whenever its flow limits (or its agent fleet) change.

    The connection has the pool's keepalives and timeouts (`options`), reaches the primary
    of a multi-host URL as the pool does, and is probed every PROBE_INTERVAL seconds. A
    server that refuses LISTEN (a standby: "cannot execute LISTEN during recovery") or stops
    answering is left, and connected to again with backoff until one accepts it."""

    def __init__(
        self,
        database_url: str,
        namespace: str,
        on_ready: Callable[[], None],
        *,
        name: str,
        channel_name: str | None = None,
        on_schedules: Callable[[], None] | None = None,
        on_limits: Callable[[], None] | None = None,
        options: EngineOptions | None = None,
    ) -> None:
        self._dsn = libpq_conninfo(database_url, options or EngineOptions())
        self._callbacks = {channel_name or channel(namespace): on_ready}
        if on_schedules is not None:
            self._callbacks[schedules_channel(namespace)] = on_schedules
        if on_limits is not None:
            self._callbacks[limits_channel(namespace)] = on_limits
        self._on_ready = on_ready
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-listen", daemon=True)
        self.connections = 0
        """LISTEN connections opened so far (the first, then one per reconnection)."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=5)

    def _run(self) -> None:
        reconnect = Reconnect()
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True) as conn:
                    for name in self._callbacks:
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))
                    self.connections += 1
                    reconnect.reset()
                    # Work may have been committed while we were not listening.
                    for callback in self._callbacks.values():
                        callback()
                    self._listen(conn)
            except psycopg.Error as exc:
                delay = reconnect.next_delay()
                log.warning("listener lost the database (%s); retrying in %.1fs", exc, delay)
                self._stop.wait(delay)

    def _listen(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        probe_at = time.monotonic() + PROBE_INTERVAL
        while not self._stop.is_set():
            for note in conn.notifies(timeout=0.5):
                self._callbacks.get(note.channel, self._on_ready)()
            if time.monotonic() >= probe_at:
                for name in _probe(conn.pgconn, PROBE_TIMEOUT):
                    self._callbacks.get(name, self._on_ready)()
                probe_at = time.monotonic() + PROBE_INTERVAL


def _probe(pgconn: pq.abc.PGconn, timeout: float) -> list[str]:
    """Run `SELECT 1` on the idle `pgconn` within `timeout` seconds, or raise
    ProbeTimeoutError (an error from the server: psycopg's OperationalError). Returns the
    channels of the notifications that arrived meanwhile, which psycopg would otherwise only
    see on the socket's next data."""
    deadline = time.monotonic() + timeout
    pgconn.send_query(b"SELECT 1")
    with selectors.DefaultSelector() as selector:
        selector.register(pgconn.socket, selectors.EVENT_WRITE)
        while pgconn.flush():  # non-blocking: 1 while the query is not all sent
            _wait(selector, deadline)
        selector.modify(pgconn.socket, selectors.EVENT_READ)
        pgconn.consume_input()
        while pgconn.is_busy():
            _wait(selector, deadline)
            pgconn.consume_input()
    failed = None
    while (result := pgconn.get_result()) is not None:
        if result.status != pq.ExecStatus.TUPLES_OK:
            failed = result.error_message.decode(errors="replace").strip()
    if failed is not None:
        raise psycopg.OperationalError(f"liveness probe failed: {failed}")
    channels = []
    while (note := pgconn.notifies()) is not None:
        channels.append(note.relname.decode(errors="replace"))
    return channels


def _wait(selector: selectors.BaseSelector, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not selector.select(remaining):
        raise ProbeTimeoutError(f"the database did not answer in {PROBE_TIMEOUT:.0f}s")
