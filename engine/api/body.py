"""The body limits, checked by a small ASGI middleware before anything parses a body: it
reads the whole body up front and refuses one larger than `api_max_body_bytes` (413), one
that has not arrived within `api_body_timeout_s` (408, and the connection is closed: a
client that declared 100 bytes and sent 10 holds nothing for long), a JSON string holding a
NUL (422) and JSON nested deeper than `api_max_json_depth` (400)."""

from __future__ import annotations

from dataclasses import dataclass

import anyio
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sasflow.api.errors import error_response
from sasflow.api.validation import NUL_MESSAGE, nul_fields, nul_problems
from sasflow.messages import nesting


@dataclass(frozen=True)
class BodyPolicy:
    max_bytes: int
    max_json_depth: int
    timeout_s: float
    """Seconds the whole body may take to arrive."""


def install(app: FastAPI, limits: BodyPolicy) -> None:
    """Check every request's body against `limits` before `app` sees it."""
    app.add_middleware(BodyLimits, limits=limits)


class _TooLargeError(Exception):
    pass


class BodyLimits:
    """Read a request's body up front within the limits, then hand it on; later `receive`
    calls (a client disconnecting from a stream) pass through, with no time limit."""

    def __init__(self, app: ASGIApp, *, limits: BodyPolicy) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await self._receive(scope, receive)
        if body is None:  # the client left before sending it all
            return
        if isinstance(body, JSONResponse):
            await body(scope, receive, send)
            return
        refusal = self._refusal(body)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _receive(self, scope: Scope, receive: Receive) -> bytes | JSONResponse | None:
        """The whole body, or the answer for one too large or too slow."""
        limits = self.limits
        too_large = error_response(
            413, "body_too_large", f"the request body is larger than {limits.max_bytes} bytes"
        )
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
            return too_large
        try:
            with anyio.fail_after(limits.timeout_s):
                return await _read(receive, limits.max_bytes)
        except TimeoutError:
            return error_response(
                408,
                "request_timeout",
                f"the request body did not arrive within {limits.timeout_s:g} seconds",
                headers={"Connection": "close"},
            )
        except _TooLargeError:
            return too_large

    def _refusal(self, body: bytes) -> JSONResponse | None:
        """The answer for a body holding a NUL or nested too deeply; None for a good one."""
        if nuls := nul_fields(body):
            return error_response(
                422,
                "validation_error",
                f"{', '.join(nuls)}: {NUL_MESSAGE}",
                extra={"fields": nul_problems(nuls)},
            )
        depth = self.limits.max_json_depth
        if body and nesting(body, depth) > depth:
            return error_response(
                400, "too_deeply_nested", f"the request body nests JSON deeper than {depth} levels"
            )
        return None


async def _read(receive: Receive, max_bytes: int) -> bytes | None:
    """The whole body (None if the client left first); _TooLarge past `max_bytes`."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise _TooLargeError
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
