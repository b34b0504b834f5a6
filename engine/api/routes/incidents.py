"""Incidents: alerts of one cause grouped while it lasts. List them, show one with its alerts,
acknowledge one with all its open alerts (the same ops as `sasflow alerts incidents`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query

from sasflow.api import responses
from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.models import ACKNOWLEDGE_EXAMPLES, AcknowledgeRequest
from sasflow.api.openapi import answers, link
from sasflow.api.validation import RowId
from sasflow.ops import incidents as incident_ops

router = APIRouter(prefix="/v1/incidents", tags=["incidents"])

Context = Annotated[ApiContext, Depends(get_context)]
FIRST = "$response.body#/incidents/0/id"


@router.get(
    "",
    response_model=responses.IncidentListResponse,
    responses={
        200: {
            "links": {
                "show_incident": link("show_incident", "The first incident", incident_id=FIRST),
                "acknowledge_incident": link(
                    "acknowledge_incident", "Acknowledge it", incident_id=FIRST
                ),
            }
        },
        **answers(),
    },
)
def list_incidents(
    ctx: Context,
    _: Annotated[Principal, Depends(require("read"))],
    include_acknowledged: bool = False,
    kind: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Open incidents (all of them with include_acknowledged), the last seen first."""
    found = ctx.transaction(
        lambda conn: incident_ops.list_incidents(
            conn, include_acknowledged=include_acknowledged, kind=kind, limit=limit
        )
    )
    return {"incidents": found}


@router.get(
    "/{incident_id}",
    response_model=responses.IncidentResponse,
    responses={
        200: {
            "links": {
                "acknowledge_incident": link(
                    "acknowledge_incident", "Acknowledge it", incident_id="$response.body#/id"
                )
            }
        },
        **answers("incident_not_found"),
    },
)
def show_incident(
    incident_id: RowId, ctx: Context, _: Annotated[Principal, Depends(require("read"))]
) -> dict[str, Any]:
    """The incident, how many of its alerts are open (what acknowledging it acknowledges: the
    preview) and its alerts."""
    found: dict[str, Any] = ctx.transaction(
        lambda conn: incident_ops.show_incident(conn, incident_id)
    )
    return found


@router.post(
    "/{incident_id}/ack",
    response_model=responses.IncidentAckResponse,
    responses=answers("incident_not_found", "already_acknowledged", body=True),
)
def acknowledge_incident(
    incident_id: RowId,
    body: Annotated[AcknowledgeRequest, Body(openapi_examples=ACKNOWLEDGE_EXAMPLES)],
    ctx: Context,
    who: Annotated[Principal, Depends(require("operate"))],
) -> dict[str, Any]:
    """Acknowledge an open incident and all its open alerts, in one audited action (the
    token's name is the actor); its resolved notice goes to the sinks; 409 if it already is."""
    done: dict[str, Any] = ctx.transaction(
        lambda conn: incident_ops.acknowledge(conn, incident_id, actor=who.name, reason=body.reason)
    )
    return done
