"""A webhook receiver for tests: an HTTP server on 127.0.0.1 recording every POST."""

from __future__ import annotations

import contextlib
import http.server
import json
import socketserver
import threading
from collections.abc import Iterator
from typing import Any, TypeVar


class WebhookServer(http.server.ThreadingHTTPServer):
    statuses: list[int]
    requests: list[tuple[dict[str, str], bytes]]


class _Receiver(http.server.BaseHTTPRequestHandler):
    server: WebhookServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append((dict(self.headers), body))
        status = self.server.statuses.pop(0) if self.server.statuses else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: Any, **_kwargs: Any) -> None:
        return  # quiet: pytest would show the access log as test output


S = TypeVar("S", bound=socketserver.BaseServer)


@contextlib.contextmanager
def serving(server: S) -> Iterator[S]:
    """Serve `server` from a thread for the duration of the block, then shut it down."""
    # shutdown() waits for serve_forever's next poll: 0.5 s by default, at every exit.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextlib.contextmanager
def webhook_server(*statuses: int, port: int = 0) -> Iterator[WebhookServer]:
    """An HTTP server on 127.0.0.1 (`port`, default: a free one) answering POSTs with
    `statuses` in turn, then 200."""
    server = WebhookServer(("127.0.0.1", port), _Receiver)
    server.statuses, server.requests = list(statuses), []
    with serving(server):
        yield server


def url_of(server: WebhookServer, path: str = "/hook/T0K3N") -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def bodies(server: WebhookServer) -> list[Any]:
    return [json.loads(body) for _headers, body in server.requests]
