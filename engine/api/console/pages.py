"""The console's pages (GET): overview, runs, a run, an alert, agents, limits, schedules, a
schedule, schedulers (the alerts page, grouped by incident, is console/incidents.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from sasflow.api.console import live
from sasflow.api.console.views import (
    PREFIX,
    RunQuery,
    Visitor,
    act,
    local,
    reader,
    render,
    visitor,
)
from sasflow.api.context import ApiContext, get_context
from sasflow.api.validation import Cursor, MapItemsShown, RowId
from sasflow.ops import agents as agent_ops
from sasflow.ops import alerts as alert_ops
from sasflow.ops import limits as limit_ops
from sasflow.ops import pause as pause_ops
from sasflow.ops import registrations
from sasflow.ops import runs as run_ops
from sasflow.ops import schedules as schedule_ops
from sasflow.ops.map_items import DEFAULT_SHOWN
from sasflow.store.db import Connection

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Context = Annotated[ApiContext, Depends(get_context)]
Reader = Annotated[Visitor, Depends(reader)]


@router.get("/login")
def login_page(
    request: Request,
    who: Annotated[Visitor, Depends(visitor)],
    target: Annotated[str, Query(alias="next")] = PREFIX,
) -> HTMLResponse:
    return render(request, who, "login.html", {"next": local(target)})


def _overview(conn: Connection) -> dict[str, Any]:
    return {
        "counts": run_ops.overview(conn),
        "alerts": alert_ops.list_alerts(conn, limit=10),
        "agents": agent_ops.list_agents(conn),
    }


@router.get("")
@router.get("/")
def overview(request: Request, who: Reader, ctx: Context) -> HTMLResponse:
    """Runs by state over the last hour and day, throughput, open alerts, the fleet."""
    return render(request, who, "overview.html", ctx.transaction(_overview))


@router.get("/overview/panel")
def overview_panel(request: Request, who: Reader, ctx: Context) -> HTMLResponse:
    """The overview's body alone: what htmx polls to refresh the page."""
    return render(request, who, "overview_panel.html", ctx.transaction(_overview))


@router.get("/runs")
def runs_page(
    *,
    request: Request,
    who: Reader,
    ctx: Context,
    state: Annotated[list[str] | None, Query()] = None,
    workflow: str = "",
    key: str = "",
    text: str = "",
    since: str = "",
    until: str = "",
    cursor: Cursor = None,
) -> HTMLResponse:
    """Runs, newest first, filtered; a page at a time (the next page's link holds a cursor)."""
    query = RunQuery(tuple(state or ()), workflow, key, text, since, until)
    return live.runs_page(request, who, ctx, query, cursor)


@router.get("/runs/{run_id}")
def run_page(
    request: Request,
    who: Reader,
    ctx: Context,
    run_id: RowId,
    map_items: MapItemsShown = DEFAULT_SHOWN,
) -> HTMLResponse:
    """The run: its steps as a table and a picture (a map's first `map_items` items listed
    under it), its timeline as bars and as events, input, output, error."""
    return live.run_page(request, who, ctx, run_id, map_items=map_items)


@router.get("/alerts/{alert_id}")
def alert_page(request: Request, who: Reader, ctx: Context, alert_id: RowId) -> HTMLResponse:
    found = act(ctx, lambda conn: alert_ops.show_alert(conn, alert_id))
    return render(request, who, "alert.html", {"alert": found})


@router.get("/agents")
def agents_page(request: Request, who: Reader, ctx: Context) -> HTMLResponse:
    """The fleet registry: every agent instance, its state, load and breakers; the paused
    agents and actions, and the buttons to pause or resume them."""
    found, paused = ctx.transaction(
        lambda conn: (
            agent_ops.list_agents(conn, include_stopped=True),
            pause_ops.paused_agents(conn),
        )
    )
    names = sorted({i["agent"] for i in found} | {p["agent"] for p in paused})
    values = {"agents": found, "paused": paused, "names": names}
    return render(request, who, "agents.html", values)


@router.get("/limits")
def limits_page(request: Request, who: Reader, ctx: Context) -> HTMLResponse:
    """Every flow limit: what it selects, its numbers, and its live state."""
    found = ctx.transaction(limit_ops.list_limits)
    return render(request, who, "limits.html", {"limits": found})


@router.get("/schedules")
def schedules_page(request: Request, who: Reader, ctx: Context) -> HTMLResponse:
    """Every schedule: timing, owner, next and last tick; pause, resume, trigger."""
    found = ctx.transaction(schedule_ops.list_schedules)
    return render(request, who, "schedules.html", {"schedules": found})


@router.get("/schedules/{ref}")
def schedule_page(request: Request, who: Reader, ctx: Context, ref: str) -> HTMLResponse:
    """One schedule (id or name): its definition, owner, last ticks with their runs, next
    tick, and the actions."""
    found = act(ctx, lambda conn: schedule_ops.show(conn, ref))
    return render(request, who, "schedule.html", {"schedule": found})


@router.get("/schedulers")
def schedulers_page(request: Request, who: Reader, ctx: Context) -> HTMLResponse:
    """The scheduler cluster: per scheduler its state, K/S/N/X/M and lease age (leader,
    epoch and range under the scope strategy); drain and undrain."""
    view, plan = ctx.transaction(
        lambda conn: (registrations.cluster_view(conn), registrations.plan_view(conn))
    )
    scoped = any(s["assignment"] == "scope" for s in view)
    return render(
        request, who, "schedulers.html", {"schedulers": view, "plan": plan, "scoped": scoped}
    )
