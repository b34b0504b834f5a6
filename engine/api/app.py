"""The FastAPI application: its routers, listed in one place, and the error shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import APIRouter, Depends, FastAPI

from sasflow.api import body, errors, openapi
from sasflow.api.console import (
    actions,
    approval_actions,
    bulk,
    live,
    pages,
    park_actions,
    pause_actions,
    schedule_actions,
    views,
    workflow_pages,
)
from sasflow.api.console import incidents as incident_pages
from sasflow.api.context import ApiContext
from sasflow.api.routes import (
    alerts,
    approvals,
    events,
    health,
    incidents,
    limits,
    park,
    pause,
    registrations,
    runs,
    schedules,
)
from sasflow.api.stream import endpoint as stream
from sasflow.api.stream.hub import StreamHub, StreamOptions
from sasflow.api.validation import refuse_nul

WORKER_THREADS = 1000
"""Sync handlers and open subscription streams share anyio's worker threads (40 by default);
each open stream holds one while it waits for updates, so the limit is raised: what bounds
the short requests is the database pool, not the thread count."""


def routers() -> list[APIRouter]:
    """Every router of the API (add a resource's router here)."""
    return [
        health.router,
        runs.router,
        alerts.router,
        incidents.router,
        schedules.router,
        registrations.router,
        limits.router,
        pause.router,
        park.router,
        events.router,
        approvals.router,
        stream.router,
        live.router,  # before pages: /ui/runs/live is not a run's page
        pages.router,
        incident_pages.router,
        actions.router,
        schedule_actions.router,
        pause_actions.router,
        park_actions.router,
        approval_actions.router,
        workflow_pages.router,
        bulk.router,
    ]


def create_app(ctx: ApiContext) -> FastAPI:
    """The API over `ctx`; OpenAPI at /openapi.json (openapi.py), the docs page at /docs."""
    hub = StreamHub(
        ctx.engine,
        ctx.settings.database_url,
        ctx.namespace,
        StreamOptions(
            heartbeat_interval=ctx.settings.api_stream_heartbeat_s,
            resend_after=ctx.settings.api_stream_resend_s,
        ),
        schema=ctx.schema,
    )
    feed = live.LiveFeed(ctx.engine, live.LiveOptions())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        to_thread.current_default_thread_limiter().total_tokens = WORKER_THREADS
        hub.start()
        feed.start()
        try:
            yield
        finally:
            feed.close()
            hub.close()

    app = FastAPI(
        lifespan=lifespan,
        title="sasflow",
        summary="REST tasks with callbacks over the sasflow workflow engine (docs/api.md).",
        version="1",
    )
    app.state.sasflow = ctx
    app.state.stream_hub = hub
    errors.install(app)
    body.install(
        app,
        body.BodyPolicy(
            max_bytes=ctx.settings.api_max_body_bytes,
            max_json_depth=ctx.settings.api_max_json_depth,
            timeout_s=ctx.settings.api_body_timeout_s,
        ),
    )
    openapi.install(app)
    views.install(app, ctx)
    app.state.console_live = feed
    for router in routers():
        app.include_router(
            router,
            dependencies=[Depends(refuse_nul)],
            generate_unique_id_function=openapi.operation_id,
        )
    return app
