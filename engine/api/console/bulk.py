"""The console's bulk actions on runs: resubmit or cancel the runs ticked on the runs page, or
every run its filter matches. Each starts with a preview, a dry run of the very service
function the action calls (its changes made in a savepoint and rolled back), listing exactly
the runs and steps it would change; confirming needs a reason and acts on the previewed runs
only (their ids travel with the form), never on runs that started matching since.

A refused form comes back with what was typed (forms.py): a preview refused (no run ticked)
is the runs list again, its filter and ticks kept and the error above its buttons; a
confirmation refused (a blank reason) is the same preview again, the error beside the
reason."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from sasflow.api.auth import Principal
from sasflow.api.console import forms, live
from sasflow.api.console.views import PREFIX, ConsoleError, RunQuery, Visitor, act, operator, render
from sasflow.api.context import ApiContext, get_context
from sasflow.ops import cancel as cancel_ops
from sasflow.ops import resubmit as resubmit_ops
from sasflow.ops.runs import RunFilter
from sasflow.store.db import Connection

router = APIRouter(prefix=PREFIX, include_in_schema=False)

BULK_LIMIT = 500
"""Runs one bulk action may touch."""

Context = Annotated[ApiContext, Depends(get_context)]
Operator = Annotated[tuple[Visitor, Principal], Depends(operator)]
T = TypeVar("T")


def _filter_only(form: Any) -> RunQuery:
    """The filter a bulk form carries, without its ticked runs."""
    return RunQuery(
        states=tuple(str(s) for s in form.getlist("state")),
        workflow=str(form.get("workflow", "")),
        key=str(form.get("key", "")),
        text=str(form.get("text", "")),
        since=str(form.get("since", "")),
        until=str(form.get("until", "")),
    )


def _query(form: Any) -> RunQuery:
    """The filter a bulk form carries; `scope=selected` means the ticked runs only."""
    try:
        ids = tuple(int(v) for v in form.getlist("run"))
    except ValueError:
        raise ConsoleError(400, "a selected run id is not a number") from None
    if form.get("scope") == "selected" and not ids:
        raise ConsoleError(400, "no run selected: tick the runs first")
    if form.get("scope") == "filter":
        ids = ()
    return dataclasses.replace(_filter_only(form), ids=ids)


def _previewed(form: Any) -> RunQuery:
    """The filter of a confirmation: the previewed ids are required."""
    query = _query(form)
    if not query.ids:
        raise ConsoleError(400, "nothing to act on: preview first")
    return query


def _runs_again(
    request: Request, who: Visitor, ctx: ApiContext, form: Any, exc: ConsoleError
) -> HTMLResponse:
    """The runs list a refused bulk preview came from, its ticked runs still ticked, the
    error above its buttons (a malformed filter: the error page, there is no list to show)."""
    ticked = frozenset(int(v) for v in form.getlist("run") if str(v).isdigit())
    return live.runs_page(
        request,
        who,
        ctx,
        _filter_only(form),
        None,
        ticked=ticked,
        compensate=form.get("compensate") == "true",
        bulk_error=exc.message,
        status=exc.status,
    )


def _run(ctx: ApiContext, query: RunQuery, work: Callable[[Connection, RunFilter], T]) -> T:
    where = query.to_filter(BULK_LIMIT)
    return act(ctx, lambda conn: work(conn, where))


def _plural(count: int, what: str) -> str:
    return f"{count} {what}" + ("" if count == 1 else "s")


# -- resubmit ------------------------------------------------------------------------------


def _resubmit(
    ctx: ApiContext, query: RunQuery, *, actor: str, reason: str, dry_run: bool
) -> list[resubmit_ops.Resubmitted]:
    return _run(
        ctx,
        query,
        lambda conn, where: resubmit_ops.resubmit_many(
            conn,
            ctx.registry,
            where,
            actor=actor,
            reason=reason,
            dry_run=dry_run,
            namespace=ctx.namespace,
        ),
    )


@router.post("/bulk/preview")
async def bulk_preview(request: Request, acting: Operator, ctx: Context) -> HTMLResponse:
    """The dry run: the resubmissions made and rolled back, so the page lists exactly the
    runs and steps the real action would redo."""
    who, principal = acting
    form = await request.form()
    try:
        query = _query(form)
        planned = _resubmit(ctx, query, actor=principal.name, reason="preview", dry_run=True)
    except ConsoleError as exc:
        return _runs_again(request, who, ctx, form, exc)
    return render(request, who, "bulk.html", {"planned": planned, "query": query, "done": False})


@router.post("/bulk/resubmit")
async def bulk_resubmit(request: Request, acting: Operator, ctx: Context) -> HTMLResponse:
    """The real bulk resubmission, limited to the runs the preview listed (`run` fields)."""
    who, principal = acting
    form = await request.form()
    query = _previewed(form)
    reason = str(form.get("reason", ""))
    try:
        why = forms.reason(reason)
    except ConsoleError as exc:  # the same preview again, the error next to the reason
        planned = _resubmit(ctx, query, actor=principal.name, reason="preview", dry_run=True)
        values = {"planned": planned, "query": query, "done": False, "reason": reason}
        return render(
            request, who, "bulk.html", {**values, "error": exc.message}, status=exc.status
        )
    done = _resubmit(ctx, query, actor=principal.name, reason=why, dry_run=False)
    flash = f"{_plural(len(done), 'run')} resubmitted"
    values = {"planned": done, "query": query, "done": True, "flash": flash}
    return render(request, who, "bulk.html", values)


# -- cancel --------------------------------------------------------------------------------


def _cancel(
    ctx: ApiContext, query: RunQuery, *, actor: str, reason: str, compensate: bool, dry_run: bool
) -> list[cancel_ops.Cancelled]:
    return _run(
        ctx,
        query,
        lambda conn, where: cancel_ops.cancel_many(
            conn,
            where,
            actor=actor,
            reason=reason,
            namespace=ctx.namespace,
            compensate=compensate,
            dry_run=dry_run,
        ),
    )


@router.post("/bulk/cancel/preview")
async def bulk_cancel_preview(request: Request, acting: Operator, ctx: Context) -> HTMLResponse:
    """The dry run of a bulk cancellation: which pending or running runs it stops, which of
    their steps, and the state each run would end in."""
    who, principal = acting
    form = await request.form()
    compensate = form.get("compensate") == "true"
    try:
        query = _query(form)
        planned = _cancel(
            ctx, query, actor=principal.name, reason="preview", compensate=compensate, dry_run=True
        )
    except ConsoleError as exc:
        return _runs_again(request, who, ctx, form, exc)
    values = {"planned": planned, "query": query, "done": False, "compensate": compensate}
    return render(request, who, "bulk_cancel.html", values)


@router.post("/bulk/cancel")
async def bulk_cancel(request: Request, acting: Operator, ctx: Context) -> HTMLResponse:
    """The real bulk cancellation of the previewed runs (those still pending or running); the
    page lists what it did and which previewed runs it left alone."""
    who, principal = acting
    form = await request.form()
    query = _previewed(form)
    compensate = form.get("compensate") == "true"
    reason = str(form.get("reason", ""))
    try:
        why = forms.reason(reason)
    except ConsoleError as exc:  # the same preview again, the error next to the reason
        planned = _cancel(
            ctx, query, actor=principal.name, reason="preview", compensate=compensate, dry_run=True
        )
        values = {"planned": planned, "query": query, "done": False, "compensate": compensate}
        values |= {"reason": reason, "error": exc.message}
        return render(request, who, "bulk_cancel.html", values, status=exc.status)
    done = _cancel(
        ctx, query, actor=principal.name, reason=why, compensate=compensate, dry_run=False
    )
    left = sorted(set(query.ids) - {c.run_id for c in done})
    flash = f"{_plural(len(done), 'run')} cancelled"
    if left:
        flash += f"; left alone (no longer pending or running): {', '.join(map(str, left))}"
    values = {
        "planned": done,
        "query": query,
        "done": True,
        "compensate": compensate,
        "left": left,
        "flash": flash,
    }
    return render(request, who, "bulk_cancel.html", values)
