"""A thread that LISTENs for ready-work notifications and calls back on each wake-up."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from sasflow.runtime import Reconnect
from sasflow.store.cluster.schedules import channel as schedules_channel
from sasflow.store.notify import channel

log = logging.getLogger(__name__)


def libpq_dsn(sqlalchemy_url: str) -> str:
    """The libpq connection string of a SQLAlchemy URL (password kept: not for logging)."""
    url = make_url(sqlalchemy_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


class ReadyListener:
    """Calls `on_ready` (from its own thread) whenever work is committed in the namespace (or
    a notification arrives on `channel_name` when given: the subscription stream's), and
    `on_schedules`, when given, whenever its schedules or scheduler registry change."""

    def __init__(
        self,
        database_url: str,
        namespace: str,
        on_ready: Callable[[], None],
        *,
        name: str,
        channel_name: str | None = None,
        on_schedules: Callable[[], None] | None = None,
    ) -> None:
        self._dsn = libpq_dsn(database_url)
        self._callbacks = {channel_name or channel(namespace): on_ready}
        if on_schedules is not None:
            self._callbacks[schedules_channel(namespace)] = on_schedules
        self._on_ready = on_ready
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        reconnect = Reconnect()
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True, connect_timeout=10) as conn:
                    for name in self._callbacks:
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))
                    reconnect.reset()
                    # Work may have been committed while we were not listening.
                    for callback in self._callbacks.values():
                        callback()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._callbacks.get(note.channel, self._on_ready)()
            except psycopg.Error as exc:
                delay = reconnect.next_delay()
                log.warning("listener lost the database (%s); retrying in %.1fs", exc, delay)
                self._stop.wait(delay)
