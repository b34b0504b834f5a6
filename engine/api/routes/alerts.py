"""Operator alerts: list them, show one, acknowledge one (the same ops as `sasflow alerts`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query

from sasflow.api import responses
from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.models import ACKNOWLEDGE_EXAMPLES, AcknowledgeRequest
from sasflow.api.openapi import answers, link
from sasflow.api.validation import RowId
from sasflow.ops import alerts as alert_ops

router = APIRouter(prefix="/v1/alerts", tags=["alerts"])

Context = Annotated[ApiContext, Depends(get_context)]
FIRST = "$response.body#/alerts/0/id"


@router.get(
    "",
    response_model=responses.AlertListResponse,
    responses={
        200: {
            "links": {
                "show_alert": link("show_alert", "The first alert", alert_id=FIRST),
                "acknowledge_alert": link("acknowledge_alert", "Acknowledge it", alert_id=FIRST),
            }
        },
        **answers(),
    },
)
def list_alerts(
    ctx: Context,
    _: Annotated[Principal, Depends(require("read"))],
    include_acknowledged: bool = False,
    kind: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    undelivered: Annotated[
        bool,
        Query(description="Only alerts a sink failed to take (retried or given up), any state."),
    ] = False,
) -> dict[str, Any]:
    """Open alerts (all of them with include_acknowledged), newest first."""
    found = ctx.transaction(
        lambda conn: alert_ops.list_alerts(
            conn,
            include_acknowledged=include_acknowledged,
            kind=kind,
            limit=limit,
            undelivered=undelivered,
        )
    )
    return {"alerts": found}


@router.get(
    "/{alert_id}",
    response_model=responses.AlertResponse,
    responses={
        200: {
            "links": {
                "acknowledge_alert": link(
                    "acknowledge_alert", "Acknowledge it", alert_id="$response.body#/id"
                )
            }
        },
        **answers("alert_not_found"),
    },
)
def show_alert(
    alert_id: RowId, ctx: Context, _: Annotated[Principal, Depends(require("read"))]
) -> dict[str, Any]:
    found: dict[str, Any] = ctx.transaction(lambda conn: alert_ops.show_alert(conn, alert_id))
    return found


@router.post(
    "/{alert_id}/ack",
    response_model=responses.AlertResponse,
    responses=answers("alert_not_found", "already_acknowledged", body=True),
)
def acknowledge_alert(
    alert_id: RowId,
    body: Annotated[AcknowledgeRequest, Body(openapi_examples=ACKNOWLEDGE_EXAMPLES)],
    ctx: Context,
    who: Annotated[Principal, Depends(require("operate"))],
) -> dict[str, Any]:
    """Acknowledge an open alert (the token's name is the actor); 409 if it already is."""
    done: dict[str, Any] = ctx.transaction(
        lambda conn: alert_ops.acknowledge(conn, alert_id, actor=who.name, reason=body.reason)
    )
    return done
