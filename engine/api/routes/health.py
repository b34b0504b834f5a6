"""/healthz (the process answers) and /readyz (the database and the broker are reachable)."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from sasflow.api.context import ApiContext, get_context
from sasflow.api.errors import UNAVAILABLE, ApiError, unavailable_message
from sasflow.api.openapi import answers
from sasflow.errors import BrokerUnavailableError, SchemaOutdatedError, StoreUnavailableError
from sasflow.store.operator import audit

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)


@router.get("/healthz", responses=answers(token=False, store=False))
def healthz() -> dict[str, str]:
    """The process is up (no dependency is checked)."""
    return {"status": "ok"}


@router.get("/readyz", responses=answers("broker_unavailable", token=False))
def readyz(ctx: Annotated[ApiContext, Depends(get_context)]) -> dict[str, Any]:
    """The database answers a query, its schema is at head, and the broker accepts a
    connection; else 503."""
    try:
        ctx.transaction(audit.database_now)
        ctx.schema.check()
    except StoreUnavailableError as exc:
        if not isinstance(exc, SchemaOutdatedError):  # the schema watch says that one once
            log.warning("not ready: %s", exc)
        code = "store_unavailable"
        raise ApiError(503, code, unavailable_message(code, exc)) from exc
    try:
        ctx.check_broker()
    except BrokerUnavailableError as exc:
        log.warning("not ready: %s", exc)
        code = "broker_unavailable"
        raise ApiError(503, code, UNAVAILABLE[code]) from exc
    return {"status": "ready", "database": "ok", "broker": "ok"}
