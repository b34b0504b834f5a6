"""Inbound events for event waits (`POST /v1/events`, `GET /v1/events`): the same service as
`sasflow events send|list` (ops/events.py; docs/api.md). Sending needs the `submit` scope (a
partner's webhook relay is a submitter of work), listing the `read` scope."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Response

from sasflow.api import responses
from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.errors import ApiError
from sasflow.api.models import EVENT_EXAMPLES, EventRequest
from sasflow.api.openapi import answers
from sasflow.errors import InvalidEventError
from sasflow.ops import events as event_ops
from sasflow.store.db import Connection

router = APIRouter(prefix="/v1/events", tags=["events"])

Context = Annotated[ApiContext, Depends(get_context)]


@router.post(
    "",
    status_code=201,
    response_model=responses.EventSentResponse,
    responses={
        201: {"description": "the event, stored (and `matched` when a wait took it at once)"},
        200: {
            "model": responses.EventSentResponse,
            "description": "an event with this name and id was stored before: unchanged",
        },
        **answers("invalid_input", body=True),
    },
)
def send_event(
    body: Annotated[EventRequest, Body(openapi_examples=EVENT_EXAMPLES)],
    response: Response,
    ctx: Context,
    who: Annotated[Principal, Depends(require("submit"))],
) -> dict[str, Any]:
    """Send an event to event waits: stored, then matched with the open wait of its name and
    correlation, or kept until one opens (within `retention` seconds, 7 days by default).
    201 stored, 200 for the same (name, id) again, with what it matched either way; 400 names
    the field it refuses."""

    def work(conn: Connection) -> dict[str, Any]:
        return event_ops.send_event(
            conn,
            body.model_dump(exclude_none=True),
            source="api",
            namespace=ctx.namespace,
            actor=who.name,
            registry=ctx.registry,
        )

    try:
        done: dict[str, Any] = ctx.transaction(work)
    except InvalidEventError as exc:
        raise ApiError(
            400,
            "invalid_input",
            f"invalid event: {exc}",
            extra={"fields": [{"field": exc.field, "message": str(exc)}]},
        ) from exc
    if done["duplicate"]:
        response.status_code = 200
    return done


@router.get("", response_model=responses.EventListResponse, responses=answers())
def list_events(
    ctx: Context,
    _: Annotated[Principal, Depends(require("read"))],
    unmatched: bool = False,
    limit: Annotated[int, Query(ge=1, le=event_ops.MAX_LISTED)] = 100,
) -> dict[str, Any]:
    """Stored events, newest first, with the step and run each completed;
    `unmatched=true`: only those waiting for their wait to open."""
    found = ctx.transaction(
        lambda conn: event_ops.list_events(conn, unmatched=unmatched, limit=limit)
    )
    return {"events": found}
