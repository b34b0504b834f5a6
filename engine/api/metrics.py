"""Prometheus metrics of the HTTP API server (`sasflow --metrics-port P api`).

An ASGI middleware (not Starlette's `BaseHTTPMiddleware`, which would buffer the subscription
stream's response through a memory stream) counts and times each request by method, route
template and status code. The route template (`/v1/runs/{run_id}`) is the label, never the
concrete path, and an unmatched request is `unmatched`: no client can grow the label set. A
subscription stream is timed from its request to its end.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sasflow.observability.metrics import ApiMetrics

UNMATCHED = "unmatched"
"""The route label of a request no route matched (404s of unknown paths)."""


class RequestMetrics:
    """ASGI middleware that observes every HTTP request into `metrics`."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self._app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers when the app raises before it starts a response

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self._app(scope, receive, sending)
        finally:
            # Starlette's router writes the matched route into this same scope.
            template = getattr(scope.get("route"), "path", None) or UNMATCHED
            self._metrics.observe(
                str(scope["method"]), str(template), status, time.perf_counter() - started
            )
