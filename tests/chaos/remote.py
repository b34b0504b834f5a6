"""The fake remote service the chaos agents call: it records every call and applies each
idempotency key's effect once, answering repeats with the stored result, as a real
idempotent API (payments, provisioning) does.

`POST /effect` applies an effect; the limited action opens a session first (`POST
/session/open`) and applies its effect through it (`POST /session/close`), refused (409) once
the session's lease ended, or gives it back without one (`POST /session/release`)
(tests/chaos/sessions.py)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.chaos.sessions import RefusedError, SessionLedger


@dataclass(frozen=True)
class RemoteCall:
    """One request as the service received it."""

    key: str
    step_id: int
    run_id: int
    step: str
    attempt: int
    pid: int
    at: float
    deduplicated: bool


@dataclass
class Ledger:
    """Calls and effects, shared by the server's request threads under one lock."""

    calls: list[RemoteCall] = field(default_factory=list)
    effects: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def apply(self, request: dict[str, Any]) -> dict[str, Any]:
        key = str(request["key"])
        with self.lock:
            effect = self.effects.get(key)
            self.calls.append(
                RemoteCall(
                    key=key,
                    step_id=int(request["step_id"]),
                    run_id=int(request["run_id"]),
                    step=str(request["step"]),
                    attempt=int(request["attempt"]),
                    pid=int(request["pid"]),
                    at=time.time(),
                    deduplicated=effect is not None,
                )
            )
            if effect is None:
                effect = {
                    "effect": len(self.effects) + 1,
                    "step_id": int(request["step_id"]),
                    "first_attempt": int(request["attempt"]),
                }
                self.effects[key] = effect
            return dict(effect)

    def snapshot(self) -> tuple[list[RemoteCall], dict[str, dict[str, Any]]]:
        with self.lock:
            return list(self.calls), {k: dict(v) for k, v in self.effects.items()}


def _answer(ledger: Ledger, sessions: SessionLedger, path: str, request: Any) -> dict[str, Any]:
    if path == "/session/open":
        return sessions.open(request)
    if path == "/session/close":
        return sessions.close(str(request["session"]), lambda: ledger.apply(request))
    if path == "/session/release":
        return sessions.release(str(request["session"]))
    if path == "/effect":
        return ledger.apply(request)
    raise KeyError(f"no such endpoint {path}")


def _handler_class(ledger: Ledger, sessions: SessionLedger) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            try:
                request = json.loads(self.rfile.read(length))
                body = json.dumps(_answer(ledger, sessions, self.path, request)).encode()
                status = 200
            except RefusedError as exc:
                body, status = json.dumps({"refused": str(exc)}).encode(), 409
            except (ValueError, KeyError, TypeError) as exc:
                body, status = json.dumps({"error": str(exc)}).encode(), 400
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
            """Quiet: the ledger is the log."""

    return Handler


class RemoteService:
    """The service on a free loopback port, served from a daemon thread."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.sessions = SessionLedger()
        self.server = ThreadingHTTPServer(
            ("127.0.0.1", 0), _handler_class(self.ledger, self.sessions)
        )
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/effect"
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="chaos-remote", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown()
            self.server.server_close()
