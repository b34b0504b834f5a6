"""/healthz (the process answers) and /readyz (the database and the broker are reachable)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from sasflow.api.context import ApiContext, get_context
from sasflow.api.errors import ApiError
from sasflow.errors import BrokerUnavailableError, StoreUnavailableError
from sasflow.store.operator import audit

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up (no dependency is checked)."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(ctx: Annotated[ApiContext, Depends(get_context)]) -> dict[str, Any]:
    """The database answers a query, its schema is at head, and the broker accepts a
    connection; else 503."""
    try:
        ctx.transaction(audit.database_now)
        ctx.schema.check()
    except StoreUnavailableError as exc:
        raise ApiError(503, "store_unavailable", f"database: {exc}") from exc
    try:
        ctx.check_broker()
    except BrokerUnavailableError as exc:
        raise ApiError(503, "broker_unavailable", f"broker: {exc}") from exc
    return {"status": "ready", "database": "ok", "broker": "ok"}
