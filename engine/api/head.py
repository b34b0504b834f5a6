"""The bound on a request's head (its request line and headers): uvicorn's HTTP protocols have
no such timeout (its keep-alive timer runs only between requests and any byte stops it), so a
client that sends half of its headers and stops would hold its connection forever, out of
reach of the body limits (body.py), which start once the head is complete.

`head_timeout_protocol` makes uvicorn's h11 protocol answer `408 request_timeout` and close
the connection when a request head is not complete `timeout_s` after the connection opened
(first request) or after the first byte of the head (the next requests of a keep-alive
connection). The clock is not restarted by more bytes: a head that trickles in is cut too. A
keep-alive connection idle between requests is left to uvicorn's keep-alive timer; once the
head is complete the body's own time limit takes over.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


def head_timeout_message(timeout_s: float) -> str:
    return f"the request head did not arrive within {timeout_s:g} seconds"


def timeout_answer(timeout_s: float) -> bytes:
    """The 408 in the API's one error shape (errors.py), written straight to the socket: h11
    has no request to answer yet, so it would refuse to frame a response."""
    body = json.dumps(
        {"error": "request_timeout", "message": head_timeout_message(timeout_s)},
        separators=(",", ":"),
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    return head + body


def head_timeout_protocol(timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the request head bounded by `timeout_s` seconds."""

    class HeadTimeoutProtocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()  # a new connection owes its first request's head

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch()  # a pipelined next request may have started its head

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _watch(self) -> None:
            """Arm the clock when bytes of a head wait for the rest; stop it once the head
            is complete (h11 has left IDLE for the client)."""
            if self.conn.their_state is not h11.IDLE:
                self._disarm()
            elif self.conn.trailing_data[0]:
                self._arm()

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expired(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            log.info(
                "closed a connection from %s: no complete request head within %gs",
                self.client,
                timeout_s,
            )
            self.transport.write(timeout_answer(timeout_s))
            self.transport.close()

    return HeadTimeoutProtocol
