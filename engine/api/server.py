"""Run the API under uvicorn, with the callback delivery loop beside it."""

from __future__ import annotations

import logging
from types import FrameType

import uvicorn
from fastapi import FastAPI

from sasflow.api.context import ApiContext

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5
"""Seconds open requests (and streams) get to finish on SIGTERM."""


def serve(app: FastAPI, ctx: ApiContext) -> None:
    """Serve `app` until SIGTERM or SIGINT (uvicorn handles both)."""
    settings = ctx.settings
    config = uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        ssl_certfile=settings.api_ssl_certfile,
        ssl_keyfile=settings.api_ssl_keyfile,
        log_config=None,  # the root logger that `sasflow --log-level` set up
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        server_header=False,
    )
    _Server(config, app).run()


class _Server(uvicorn.Server):
    """Ends the subscription streams (ERROR, then the end of the response) as soon as the
    server is asked to stop: uvicorn waits for open responses before the app's shutdown, and
    a stream never ends by itself."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._app.state.stream_hub.end_streams()
        super().handle_exit(sig, frame)
