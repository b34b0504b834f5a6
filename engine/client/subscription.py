"""Following the subscription stream: RecordIO records in, handler calls, acknowledgements out,
and reconnection as the same subscriber.

The stream is at least once: an update whose acknowledgement was lost (the handler returned,
then the connection broke) comes again after the reconnection, with the same `uuid`; a handler
that must act once dedupes on it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sasflow.client.errors import ApiError
from sasflow.errors import InvalidMessageError
from sasflow.recordio import Decoder

log = logging.getLogger(__name__)

STREAM_ID_HEADER = "Sasflow-Stream-Id"
STREAM_PATH = "/v1/stream"
MISSED_HEARTBEATS = 5
"""A stream silent for this many heartbeat intervals is dead: the subscription reconnects."""
DEFAULT_HEARTBEAT = 15.0
"""The interval assumed until the server's SUBSCRIBED tells the real one (the server's default)."""
FIRST_BACKOFF = 0.5
ACK_BATCH = 1000
"""Most acknowledgements sent in one call (the server's limit)."""


@dataclass(frozen=True)
class StreamFilter:
    """Which runs' changes to receive: all by default; only those of `workflows`; only the
    runs this token submitted."""

    workflows: tuple[str, ...] | None = None
    runs_submitted_by_me: bool = False

    @classmethod
    def of(cls, value: StreamFilter | Mapping[str, Any]) -> StreamFilter:
        if isinstance(value, StreamFilter):
            return value
        workflows = value.get("workflows")
        return cls(
            workflows=None if workflows is None else tuple(workflows),
            runs_submitted_by_me=bool(value.get("runs_submitted_by_me", False)),
        )

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"runs_submitted_by_me": self.runs_submitted_by_me}
        if self.workflows is not None:
            body["workflows"] = list(self.workflows)
        return body


@dataclass(frozen=True)
class StreamUpdate:
    """One UPDATE: a run's or step's state change (`uuid` None for a RECONCILE answer, which
    needs no acknowledgement; `state` None when RECONCILE named an unknown run)."""

    run: int
    state: str | None
    uuid: str | None = None
    workflow: str | None = None
    key: str | None = None
    entity: str | None = None
    step: str | None = None
    previous: str | None = None
    at: str | None = None
    reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> StreamUpdate:
        try:
            return cls(
                run=int(record["run"]),
                state=record.get("state"),
                uuid=record.get("uuid"),
                workflow=record.get("workflow"),
                key=record.get("key"),
                entity=record.get("entity"),
                step=record.get("step"),
                previous=record.get("previous"),
                at=record.get("at"),
                reason=record.get("reason"),
                raw=record,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidMessageError(f"UPDATE without a run id: {record!r:.200}") from exc


class _StreamEnded(Exception):  # noqa: N818 - control flow, not an error
    """The current stream is over (ERROR received, or it was replaced): reconnect."""


class Subscription:
    """One subscriber's stream, followed by `run()` until `stop` is set or `teardown()`."""

    def __init__(
        self,
        http: httpx.Client,
        where: StreamFilter,
        handler: Callable[[StreamUpdate], None],
        *,
        name: str,
        subscriber_id: str | None = None,
        max_backoff: float = 15.0,
        stop: threading.Event | None = None,
        on_failure: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self._http = http
        self._where = where
        self._handler = handler
        self._on_failure = on_failure
        self._name = name
        self._max_backoff = max_backoff
        self.subscriber_id = subscriber_id
        """Set by the first SUBSCRIBED; pass it to a later `subscription` to resume."""
        self.stream_id: str | None = None
        self.heartbeat_interval = DEFAULT_HEARTBEAT
        self.connections = 0
        """How many streams were opened (SUBSCRIBED received)."""
        self.stop_event = stop or threading.Event()
        self._torn_down = False
        self._acks = _Acknowledger(self)

    def stop(self) -> None:
        """Ask `run()` to return (at the next record or heartbeat at the latest)."""
        self.stop_event.set()

    def run(self) -> None:
        """Follow the stream, reconnecting with exponential backoff (capped at `max_backoff`)
        until stopped. Raises ApiError when the server refuses the subscription for good
        (401, 403, 404, 400): retrying would not help."""
        self._acks = _Acknowledger(self)
        self._acks.start()
        try:
            self._reconnecting()
        finally:
            self._acks.close()

    def _reconnecting(self) -> None:
        backoff = FIRST_BACKOFF
        while not self.stop_event.is_set() and not self._torn_down:
            connections = self.connections
            try:
                self._follow()
            except ApiError as exc:
                if exc.status < 500 and exc.status != 429:
                    raise
                log.warning("subscription refused for now (%s)", exc)
            except (httpx.TransportError, InvalidMessageError, _StreamEnded) as exc:
                log.info("stream of subscriber %s lost: %s", self.subscriber_id, exc)
            if self.connections > connections:
                backoff = FIRST_BACKOFF
            if self.stop_event.is_set() or self._torn_down:
                return
            self.stop_event.wait(backoff * random.uniform(0.5, 1.0))  # noqa: S311 - jitter
            backoff = min(backoff * 2, self._max_backoff)

    def reconcile(self, runs: Sequence[int] = ()) -> None:
        """Ask for the current state of `runs` (all active runs of the filter when empty),
        answered on the stream by UPDATEs without uuid."""
        self.call({"type": "RECONCILE", "runs": list(runs)})

    def kill(self, run: int) -> None:
        """Cancel a run this token submitted (any run with the `operate` scope)."""
        self.call({"type": "KILL", "run": run})

    def teardown(self) -> None:
        """Cancel this subscriber's runs, delete the subscriber and end the stream."""
        self.call({"type": "TEARDOWN"})
        self._torn_down = True
        self.stop_event.set()

    def call(self, body: dict[str, Any]) -> None:
        """One call on the current stream, on a connection of its own."""
        if self.stream_id is None:
            raise ApiError(403, "no_stream", "the subscription has no current stream")
        response = self._http.post(
            STREAM_PATH, json=body, headers={STREAM_ID_HEADER: self.stream_id}
        )
        if response.is_error:
            raise ApiError.of(response)

    def _follow(self) -> None:
        subscriber: dict[str, Any] = {"name": self._name}
        if self.subscriber_id is not None:
            subscriber["id"] = self.subscriber_id
        body = {"type": "SUBSCRIBE", "subscriber": subscriber, "filter": self._where.body()}
        # The read timeout is the backstop; the watchdog applies the interval the server
        # announces (a socket read's timeout is fixed when the response starts).
        timeout = httpx.Timeout(
            self._http.timeout.connect,
            read=MISSED_HEARTBEATS * max(self.heartbeat_interval, DEFAULT_HEARTBEAT),
        )
        with (
            self._http.stream("POST", STREAM_PATH, json=body, timeout=timeout) as response,
            _Watchdog(response, lambda: MISSED_HEARTBEATS * self.heartbeat_interval) as watchdog,
        ):
            if response.is_error:
                response.read()
                raise ApiError.of(response)
            self.stream_id = response.headers.get(STREAM_ID_HEADER)
            decoder = Decoder()
            for chunk in response.iter_bytes():
                watchdog.alive()
                with watchdog.paused():  # the handler's time is not the stream's silence
                    for record in decoder.feed(chunk):
                        self._on_record(record)
                if self._acks.refused.is_set():
                    self._acks.refused.clear()
                    raise _StreamEnded("an acknowledgement was refused: the stream is not current")
                if self.stop_event.is_set():
                    return

    def _on_record(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "SUBSCRIBED":
            self.subscriber_id = str(record["subscriber_id"])
            self.heartbeat_interval = float(record["heartbeat_interval_seconds"])
            self.connections += 1
        elif kind == "UPDATE":
            self._deliver(StreamUpdate.from_record(record))
        elif kind == "FAILURE":
            log.warning("agent instance lost: %s", record.get("instance_id"))
            if self._on_failure is not None:
                try:
                    self._on_failure(record)
                except Exception:
                    log.exception("on_failure failed on a FAILURE record")
        elif kind == "ERROR":
            raise _StreamEnded(str(record.get("message")))
        elif kind != "HEARTBEAT":
            log.debug("ignoring a %s record", kind)  # newer servers may send more kinds

    def _deliver(self, update: StreamUpdate) -> None:
        try:
            self._handler(update)
        except Exception:
            # Not acknowledged: the server sends it again (after its resend timeout).
            log.exception("handler failed on update %s of run %s", update.uuid, update.run)
            return
        if update.uuid is not None:
            self._acks.put(update.uuid)


class _Watchdog:
    """Shuts the stream's socket down when nothing has arrived for `limit()` seconds (5
    heartbeat intervals), which ends the read at once: the subscription reconnects. Does
    nothing when the transport gives no socket (then the read timeout decides)."""

    def __init__(self, response: httpx.Response, limit: Callable[[], float]) -> None:
        stream = response.extensions.get("network_stream")
        self._socket: socket.socket | None = (
            None if stream is None else stream.get_extra_info("socket")
        )
        self._limit = limit
        self._last = time.monotonic()
        self._busy = 0
        self._done = threading.Event()
        self.expired = False

    def __enter__(self) -> _Watchdog:
        if self._socket is not None:
            threading.Thread(
                target=self._watch, args=(self._socket,), name="sasflow-watchdog", daemon=True
            ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def alive(self) -> None:
        self._last = time.monotonic()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
            self._last = time.monotonic()

    def _watch(self, sock: socket.socket) -> None:
        while not self._done.wait(min(1.0, self._limit() / 10)):
            if self._busy or time.monotonic() - self._last < self._limit():
                continue
            self.expired = True
            log.warning("stream silent for %.1fs: reconnecting", self._limit())
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            return


class _Acknowledger:
    """Sends the acknowledgements of handled updates from a thread of its own, so that reading
    the stream never waits for them; those that queue up meanwhile go in one call. Each call
    names the subscription's current stream. A lost acknowledgement only means the update comes
    again (at least once)."""

    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.refused = threading.Event()
        """Set when the server refused an acknowledgement (403: not the current stream)."""
        self._thread = threading.Thread(target=self._run, name="sasflow-acks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, update_uuid: str) -> None:
        self._queue.put(update_uuid)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch: list[str] = []
            item = self._queue.get()
            while item is not None:
                batch.append(item)
                if len(batch) == ACK_BATCH or self._queue.empty():
                    break
                item = self._queue.get_nowait()
            if batch:
                self._send(batch)
            if item is None:
                return

    def _send(self, batch: list[str]) -> None:
        try:
            self._subscription.call({"type": "ACKNOWLEDGE", "uuids": batch})
        except ApiError as exc:
            log.warning("%d acknowledgements refused: %s", len(batch), exc)
            if exc.status == 403:
                self.refused.set()
        except httpx.TransportError as exc:
            log.info("%d acknowledgements lost (%s): the updates come again", len(batch), exc)
