"""The console's workflow pages (GET): every workflow with its recent totals, and one
workflow's charts (throughput, failure rate, p50/p95 duration) over a chosen window."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from sasflow.api.console import charts
from sasflow.api.console.views import PREFIX, Visitor, act, reader, render
from sasflow.api.context import ApiContext, get_context
from sasflow.ops import workflows as workflow_ops

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Context = Annotated[ApiContext, Depends(get_context)]
Reader = Annotated[Visitor, Depends(reader)]


@router.get("/workflows")
def workflows_page(request: Request, who: Reader, ctx: Context) -> HTMLResponse:
    """Every workflow the app defines or that finished runs in the last day: runs finished in
    the last hour and day, the day's failure rate."""
    known = {w.name for w in ctx.registry.workflows}
    found = ctx.transaction(lambda conn: workflow_ops.totals(conn, known))
    return render(
        request, who, "workflows.html", {"workflows": found, "percent": charts.FORMATS["percent"]}
    )


@router.get("/workflows/{name}")
def workflow_page(
    request: Request, who: Reader, ctx: Context, name: str, window: str = "24h"
) -> HTMLResponse:
    """The workflow's finished runs per bucket over the window (1h, 24h, 7d): charts drawn as
    inline SVG, and the same figures as a table."""
    chosen = act(ctx, lambda _: workflow_ops.window(window))
    series = ctx.transaction(lambda conn: workflow_ops.series(conn, name, chosen))
    return render(
        request,
        who,
        "workflow.html",
        {
            "name": name,
            "series": series,
            "window": chosen,
            "windows": workflow_ops.WINDOWS,
            "charts": charts.charts(series),
            "fmt": charts.FORMATS,
        },
    )
