"""The subscription stream's server side: one generator of RecordIO bytes per open stream, and
the hub that wakes them.

Streams keep no state of their own: each wake-up re-reads the subscriber's row (is this still
its current stream?) and takes the updates due on it, in one transaction with the row locked,
so any number of API servers can serve, replace and end one another's streams. PostgreSQL
NOTIFY (from the relay's fan-out, a RECONCILE, a new stream or a TEARDOWN) wakes them at once;
without it, and to re-send updates not acknowledged in time, they poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sasflow.errors import SchemaOutdatedError, StoreUnavailableError
from sasflow.recordio import encode
from sasflow.schema_watch import SchemaWatch
from sasflow.store.db import Connection, Engine, run_transaction
from sasflow.store.dialect import has_notifications
from sasflow.store.listen import ReadyListener
from sasflow.store.outbox import stream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamOptions:
    heartbeat_interval: float = 15.0
    """Seconds between HEARTBEAT records (clients call a stream dead after 5 missed)."""
    resend_after: float = 30.0
    """Seconds after which an update sent but not acknowledged is sent again on the stream."""
    batch: int = 500
    """Most updates taken in one transaction."""
    poll_interval: float | None = None
    """Seconds between re-reads when nothing woke the stream (default: 2 with PostgreSQL
    NOTIFY, 0.25 without)."""


class Waker:
    """A generation counter: waiters sleep until it moves past the value they saw."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0

    @property
    def generation(self) -> int:
        with self._cond:
            return self._generation

    def wake(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> None:
        """Return when woken after `seen` was read, or after `timeout` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self._generation != seen, timeout=max(timeout, 0.0))


class StreamHub:
    """The open streams of one API server: `records` serves one; `close` ends them all."""

    def __init__(
        self,
        engine: Engine,
        database_url: str,
        namespace: str,
        options: StreamOptions,
        *,
        schema: SchemaWatch | None = None,
    ) -> None:
        self._engine = engine
        self._schema = schema or SchemaWatch(engine, "api-stream")
        self._options = options
        self._waker = Waker()
        self._closing = threading.Event()
        notifications = has_notifications(engine)
        self._poll = options.poll_interval or (2.0 if notifications else 0.25)
        self._listener = (
            ReadyListener(
                database_url,
                namespace,
                self._waker.wake,
                name="api-stream",
                channel_name=stream.channel(namespace),
            )
            if notifications
            else None
        )

    @property
    def options(self) -> StreamOptions:
        return self._options

    def start(self) -> None:
        if self._listener is not None:
            self._listener.start()

    def end_streams(self) -> None:
        """Make every open stream, and any opened later, send ERROR and end (does not block:
        safe from a signal handler)."""
        self._closing.set()
        self._waker.wake()

    def close(self) -> None:
        """End every open stream and stop listening."""
        self.end_streams()
        if self._listener is not None:
            self._listener.stop()

    def wake(self) -> None:
        """Make every open stream re-read its rows now."""
        self._waker.wake()

    def records(self, subscriber_id: str, stream_id: str) -> Iterator[bytes]:
        """The stream's bytes: SUBSCRIBED, then UPDATEs and HEARTBEATs until it is replaced,
        its subscriber torn down, the store lost or the server closing (ERROR, then the end)."""
        heartbeat = self._options.heartbeat_interval
        yield encode(
            {
                "type": "SUBSCRIBED",
                "subscriber_id": subscriber_id,
                "heartbeat_interval_seconds": heartbeat,
            }
        )
        next_beat = time.monotonic() + heartbeat
        while True:
            seen = self._waker.generation
            if self._closing.is_set():
                yield _error("the API server is shutting down: reconnect")
                return
            now = time.monotonic()
            beat = now >= next_beat
            try:
                current, due = self._take(subscriber_id, stream_id, touch=beat)
            except StoreUnavailableError as exc:
                if isinstance(exc, SchemaOutdatedError):
                    self._schema.failed(exc)  # said once, not once per stream
                else:
                    log.warning("stream %s: %s", stream_id, exc)
                yield _error("the state store is unavailable: reconnect")
                return
            if not current:
                yield _error("this stream was replaced by a newer one or torn down")
                return
            if due:
                yield b"".join(encode(_update(d)) for d in due)
            if beat:
                yield encode({"type": "HEARTBEAT"})
                next_beat = now + heartbeat
            if len(due) == self._options.batch:
                continue  # more may be due at once
            now = time.monotonic()
            self._waker.wait(seen, min(next_beat - now, self._poll))

    def _take(
        self, subscriber_id: str, stream_id: str, *, touch: bool
    ) -> tuple[bool, list[stream.Due]]:
        """(still the current stream?, the updates now due on it), retried on a deadlock;
        `touch`: also record that the subscriber's stream is open (at each heartbeat)."""

        def work(conn: Connection) -> tuple[bool, list[stream.Due]]:
            if not stream.lock_if_current(conn, subscriber_id, stream_id):
                return False, []
            if touch:
                stream.touch(conn, subscriber_id)
            due = stream.take_due(
                conn,
                subscriber_id,
                stream_id,
                resend_after=self._options.resend_after,
                limit=self._options.batch,
            )
            return True, due

        return run_transaction(self._engine, work)


def _update(due: stream.Due) -> dict[str, Any]:
    """An UPDATE record, or the record its body names (a FAILURE carries `"type"`)."""
    record: dict[str, Any] = {"type": "UPDATE"}
    if due.uuid is not None:
        record["uuid"] = due.uuid
    record.update(due.body)
    return record


def _error(message: str) -> bytes:
    return encode({"type": "ERROR", "message": message})
