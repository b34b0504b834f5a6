"""Run the API under uvicorn, with the callback delivery loop beside it."""

from __future__ import annotations

import logging
import threading
from types import FrameType

import uvicorn
from fastapi import FastAPI

from sasflow.api.callbacks import CallbackPolicy, CallbackSender
from sasflow.api.context import ApiContext
from sasflow.api.head import head_timeout_protocol

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5
"""Seconds open requests (and streams) get to finish on SIGTERM."""


def serve(app: FastAPI, ctx: ApiContext) -> None:
    """Serve `app` until SIGTERM or SIGINT (uvicorn handles both); deliver callbacks from a
    thread meanwhile when SASFLOW_API_CALLBACKS is on and a callback key is set."""
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
        http=head_timeout_protocol(settings.api_header_timeout_s),
    )
    stop = threading.Event()
    sender = callback_thread(ctx, stop)
    if sender is not None:
        sender.start()
    try:
        _Server(config, app).run()
    finally:
        stop.set()
        if sender is not None:
            sender.join(timeout=settings.api_callback_timeout_s + 5)


def callback_thread(ctx: ApiContext, stop: threading.Event) -> threading.Thread | None:
    """The callback loop's thread, or None when this server does not deliver callbacks."""
    settings = ctx.settings
    if not settings.api_callbacks:
        return None
    if settings.api_callback_secret is None:
        log.info("no SASFLOW_API_CALLBACK_SECRET: callbacks are off (runs cannot ask for one)")
        return None
    sender = CallbackSender(
        ctx.engine,
        settings.api_callback_secret.get_secret_value().encode(),
        CallbackPolicy.from_settings(settings),
        stop=stop,
        schema=ctx.schema,
    )
    return threading.Thread(target=sender.run, name="sasflow-callbacks", daemon=True)


class _Server(uvicorn.Server):
    """Ends the subscription streams (ERROR, then the end of the response) and the console's
    live pages as soon as the server is asked to stop: uvicorn waits for open responses
    before the app's shutdown, and a stream never ends by itself."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._app.state.stream_hub.end_streams()
        self._app.state.console_live.end()
        super().handle_exit(sig, frame)
