"""A receiver of sasflow's HTTP callbacks: check the signature, act once per idempotency key.

    SASFLOW_API_CALLBACK_SECRET=... python -m examples.callback_receiver 8099

Standard library only, so it reads the same in any language: HMAC-SHA256 over the raw body,
a constant-time comparison, a 2xx only once the callback is handled (anything else makes
sasflow retry), and a set of seen keys (use a unique column of your own database instead).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.server
import json
import os
import threading
from typing import Any


def signature_ok(secret: bytes, body: bytes, header: str | None) -> bool:
    """Whether `header` (Sasflow-Signature) is the HMAC-SHA256 of `body` under `secret`."""
    expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    return header is not None and hmac.compare_digest(expected, header)


class Receiver(http.server.ThreadingHTTPServer):
    """Calls `handle(payload)` once per idempotency key; answers 401 to a bad signature."""

    def __init__(self, port: int, secret: bytes, handle: Any) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.secret = secret
        self.handle = handle
        self.seen: set[str] = set()
        self.lock = threading.Lock()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not signature_ok(self.server.secret, body, self.headers.get("Sasflow-Signature")):
            self._answer(401)
            return
        key = self.headers.get("Sasflow-Idempotency-Key", "")
        with self.server.lock:
            first = key not in self.server.seen
            if first:
                self.server.handle(json.loads(body))  # if this raises, no 2xx: sent again
                self.server.seen.add(key)
        self._answer(200)

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        return


def main() -> None:
    parser = argparse.ArgumentParser(description="Receive sasflow callbacks on 127.0.0.1.")
    parser.add_argument("port", type=int, nargs="?", default=8099)
    port = parser.parse_args().port
    secret = os.environ["SASFLOW_API_CALLBACK_SECRET"].encode()

    def handle(payload: Any) -> None:
        run = payload["run"]
        print(f"run {run['id']} ({run['workflow']}, key {run['key']}) ended {run['state']}")

    Receiver(port, secret, handle).serve_forever()


if __name__ == "__main__":
    main()
