"""The FastAPI application: its routers, listed in one place, and the error shape."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from sasflow.api import errors
from sasflow.api.console import actions, pages, views
from sasflow.api.context import ApiContext
from sasflow.api.routes import alerts, health, runs


def routers() -> list[APIRouter]:
    """Every router of the API (add a resource's router here)."""
    return [
        health.router,
        runs.router,
        alerts.router,
        pages.router,
        actions.router,
    ]


def create_app(ctx: ApiContext) -> FastAPI:
    """The API over `ctx`; OpenAPI at /openapi.json, the docs page at /docs."""
    app = FastAPI(
        title="sasflow",
        summary="REST tasks with callbacks over the sasflow workflow engine (docs/api.md).",
        version="1",
    )
    app.state.sasflow = ctx
    errors.install(
        app,
        max_body_bytes=ctx.settings.api_max_body_bytes,
        max_json_depth=ctx.settings.api_max_json_depth,
    )
    views.install(app, ctx)
    for router in routers():
        app.include_router(router)
    return app
