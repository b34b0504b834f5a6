"""The console's incidents: the alerts page lists them (alerts grouped by cause; one alert at
a time with ?view=alerts), an incident's page lists its alerts and runs, and acknowledging one
or several ticked ones goes through a preview (what each would acknowledge), a required
reason, then a result page that says what was done. Each incident is acknowledged in its own
transaction by the same service function as `sasflow alerts ack --incident` and the REST API.

The result is the page the confirming post answers (as the bulk resubmission's), not a
redirect with a one-time message: it is built from what the service function returned."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from sasflow.api.auth import Principal
from sasflow.api.console.views import PREFIX, ConsoleError, Visitor, act, operator, reader, render
from sasflow.api.context import ApiContext, get_context
from sasflow.api.validation import RowId
from sasflow.errors import (
    IncidentAlreadyAcknowledgedError,
    IncidentNotFoundError,
    InvalidAcknowledgementError,
)
from sasflow.ops import alerts as alert_ops
from sasflow.ops import incidents as incident_ops

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Context = Annotated[ApiContext, Depends(get_context)]
Reader = Annotated[Visitor, Depends(reader)]
Operator = Annotated[tuple[Visitor, Principal], Depends(operator)]

SELECT_LIMIT = 200
"""Incidents one acknowledgement may take (the page lists at most as many)."""
_REFUSED = (IncidentNotFoundError, IncidentAlreadyAcknowledgedError)


@dataclass(frozen=True)
class Outcome:
    """One ticked incident in a preview or a result: the incident, or why it cannot be."""

    incident_id: int
    incident: dict[str, Any] | None
    error: str | None = None


@router.get("/alerts")
def alerts_page(
    request: Request,
    who: Reader,
    ctx: Context,
    everything: Annotated[bool, Query(alias="all")] = False,
    view: Annotated[str, Query(pattern="^(incidents|alerts)$")] = "incidents",
) -> HTMLResponse:
    """Open incidents, the last seen first (all of them with ?all=true); one alert a row with
    ?view=alerts."""
    if view == "alerts":
        found = ctx.transaction(
            lambda conn: alert_ops.list_alerts(conn, include_acknowledged=everything, limit=200)
        )
        return render(request, who, "alerts.html", {"alerts": found, "all": everything})
    listed = ctx.transaction(
        lambda conn: incident_ops.list_incidents(
            conn, include_acknowledged=everything, limit=SELECT_LIMIT
        )
    )
    return render(request, who, "incidents.html", {"incidents": listed, "all": everything})


@router.get("/incidents/{incident_id}")
def incident_page(request: Request, who: Reader, ctx: Context, incident_id: RowId) -> HTMLResponse:
    """The incident: its cause, count, first and last seen, and its alerts with their runs."""
    found = act(ctx, lambda conn: incident_ops.show_incident(conn, incident_id))
    return render(request, who, "incident.html", {"incident": found})


def _ticked(form: Any) -> list[int]:
    try:
        ids = list(dict.fromkeys(int(v) for v in form.getlist("incident")))
    except ValueError:
        raise ConsoleError(400, "a ticked incident id is not a number") from None
    if not ids:
        raise ConsoleError(400, "no incident ticked: tick the incidents to acknowledge")
    if len(ids) > SELECT_LIMIT:
        raise ConsoleError(400, f"at most {SELECT_LIMIT} incidents at once")
    return ids


@router.post("/incidents/preview")
async def preview(request: Request, acting: Operator, ctx: Context) -> HTMLResponse:
    """What acknowledging the ticked incidents would do: each with the open alerts it would
    acknowledge, or why it cannot be (already acknowledged, gone)."""
    who, _ = acting
    planned: list[Outcome] = []
    for incident_id in _ticked(await request.form()):
        try:
            found = ctx.transaction(
                lambda conn, i=incident_id: incident_ops.preview(conn, i)  # type: ignore[misc]
            )
        except _REFUSED as exc:
            planned.append(Outcome(incident_id, None, str(exc)))
        else:
            planned.append(Outcome(incident_id, found))
    return render(request, who, "incidents_ack.html", {"outcomes": planned, "done": False})


@router.post("/incidents/ack")
async def acknowledge(request: Request, acting: Operator, ctx: Context) -> HTMLResponse:
    """Acknowledge the incidents the preview listed, each in its own transaction, with the
    reason; the page says what each became."""
    who, principal = acting
    form = await request.form()
    ids = _ticked(form)
    reason = str(form.get("reason", "")).strip()
    if not reason:
        raise ConsoleError(400, "a reason is required")
    done: list[Outcome] = []
    for incident_id in ids:
        try:
            acked = ctx.transaction(
                lambda conn, i=incident_id: incident_ops.acknowledge(  # type: ignore[misc]
                    conn, i, actor=principal.name, reason=reason
                )
            )
        except _REFUSED as exc:
            done.append(Outcome(incident_id, None, str(exc)))
        except InvalidAcknowledgementError as exc:
            raise ConsoleError(400, str(exc)) from exc
        else:
            done.append(Outcome(incident_id, acked))
    alerts = sum(o.incident["alerts_acknowledged"] for o in done if o.incident is not None)
    return render(
        request,
        who,
        "incidents_ack.html",
        {"outcomes": done, "done": True, "reason": reason, "alerts": alerts},
    )
