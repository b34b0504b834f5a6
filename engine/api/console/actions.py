"""The console's form posts: sign in and out, cancel, resubmit (one run or in bulk after a
dry run), acknowledge an alert. Every post carries the session's CSRF token; the actions
need the `operate` scope and call the same service functions as the CLI and the REST API."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from sasflow.api.auth import Principal
from sasflow.api.console.session import Session, SessionCodec
from sasflow.api.console.views import (
    PREFIX,
    ConsoleError,
    RunQuery,
    Visitor,
    act,
    checked,
    local,
    operator,
    redirect,
    render,
)
from sasflow.api.context import ApiContext, get_context
from sasflow.api.validation import RowId
from sasflow.ops import alerts as alert_ops
from sasflow.ops import cancel as cancel_ops
from sasflow.ops import resubmit as resubmit_ops
from sasflow.ops import tokens
from sasflow.ops.resubmit import Resubmitted

router = APIRouter(prefix=PREFIX, include_in_schema=False)

BULK_LIMIT = 500
"""Runs one bulk resubmission may touch."""

Context = Annotated[ApiContext, Depends(get_context)]
Checked = Annotated[Visitor, Depends(checked)]
Operator = Annotated[tuple[Visitor, Principal], Depends(operator)]


def _reason(text: str) -> str:
    if not text.strip():
        raise ConsoleError(400, "a reason is required")
    return text.strip()


@router.post("/login", response_model=None)
def login(
    request: Request,
    who: Checked,
    ctx: Context,
    token: Annotated[str, Form()] = "",
    target: Annotated[str, Form(alias="next")] = PREFIX,
) -> HTMLResponse | RedirectResponse:
    """Exchange an API token (scope `read` at least) for a session; the token itself is not
    kept, its hash is."""
    found = ctx.transaction(lambda conn: tokens.authenticate(conn, token.strip()))
    if found is None or not tokens.grants(found["scopes"], "read"):
        message = "unknown or revoked token" if found is None else "the token lacks 'read'"
        return render(request, who, "login.html", {"next": PREFIX, "error": message}, status=401)
    session = Session(csrf=who.session.csrf, token_hash=tokens.hash_token(token.strip()))
    return redirect(request, Visitor(session), local(target))


@router.post("/logout")
def logout(_: Checked) -> RedirectResponse:
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    SessionCodec.clear(response)
    return response


@router.post("/runs/{run_id}/cancel")
def cancel(
    *,
    request: Request,
    acting: Operator,
    ctx: Context,
    run_id: RowId,
    reason: Annotated[str, Form()] = "",
    compensate: Annotated[bool, Form()] = False,
) -> RedirectResponse:
    who, principal = acting
    why = _reason(reason)
    act(
        ctx,
        lambda conn: cancel_ops.cancel(
            conn,
            run_id,
            actor=principal.name,
            reason=why,
            namespace=ctx.namespace,
            compensate=compensate,
        ),
    )
    return redirect(request, who, f"{PREFIX}/runs/{run_id}")


@router.post("/runs/{run_id}/resubmit")
def resubmit(
    *,
    request: Request,
    acting: Operator,
    ctx: Context,
    run_id: RowId,
    reason: Annotated[str, Form()] = "",
    from_step: Annotated[str, Form()] = "",
    edited: Annotated[str, Form(alias="input")] = "",
    original_input: Annotated[str, Form()] = "",
) -> RedirectResponse:
    """Resubmit from the failed steps or `from_step`; an edited input must be a JSON object
    (checked here, then against the message limits by the service function)."""
    who, principal = acting
    why = _reason(reason)
    new_input = _edited_input(edited, original_input)
    act(
        ctx,
        lambda conn: resubmit_ops.resubmit(
            conn,
            ctx.registry,
            run_id,
            actor=principal.name,
            reason=why,
            namespace=ctx.namespace,
            from_step=from_step or None,
            new_input=new_input,
        ),
    )
    return redirect(request, who, f"{PREFIX}/runs/{run_id}")


def _edited_input(text: str, original: str) -> Any:
    """The corrected input, or None when the field was left as it was shown."""
    if not text.strip() or _same_json(text, original):
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConsoleError(400, f"the edited input is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConsoleError(400, "the edited input must be a JSON object")
    return value


def _same_json(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


def _bulk(
    ctx: ApiContext, query: RunQuery, *, actor: str, reason: str, dry_run: bool
) -> list[Resubmitted]:
    where = query.to_filter(BULK_LIMIT)
    return act(
        ctx,
        lambda conn: resubmit_ops.resubmit_many(
            conn,
            ctx.registry,
            where,
            actor=actor,
            reason=reason,
            dry_run=dry_run,
            namespace=ctx.namespace,
        ),
    )


def _query(form: Any) -> RunQuery:
    """The filter a bulk form carries; `scope=selected` means the ticked runs only."""
    try:
        ids = tuple(int(v) for v in form.getlist("run"))
    except ValueError:
        raise ConsoleError(400, "a selected run id is not a number") from None
    if form.get("scope") == "selected" and not ids:
        raise ConsoleError(400, "no run selected: tick the runs to resubmit")
    if form.get("scope") == "filter":
        ids = ()
    return RunQuery(
        states=tuple(str(s) for s in form.getlist("state")),
        workflow=str(form.get("workflow", "")),
        key=str(form.get("key", "")),
        text=str(form.get("text", "")),
        since=str(form.get("since", "")),
        until=str(form.get("until", "")),
        ids=ids,
    )


@router.post("/bulk/preview")
async def bulk_preview(request: Request, acting: Operator, ctx: Context) -> HTMLResponse:
    """The dry run: the resubmissions made and rolled back, so the page lists exactly the
    runs and steps the real action would redo."""
    who, principal = acting
    query = _query(await request.form())
    planned = _bulk(ctx, query, actor=principal.name, reason="preview", dry_run=True)
    return render(request, who, "bulk.html", {"planned": planned, "query": query, "done": False})


@router.post("/bulk/resubmit")
async def bulk_resubmit(request: Request, acting: Operator, ctx: Context) -> HTMLResponse:
    """The real bulk resubmission, limited to the runs the preview listed (`run` fields)."""
    who, principal = acting
    form = await request.form()
    query = _query(form)
    if not query.ids:
        raise ConsoleError(400, "nothing to resubmit: preview first")
    why = _reason(str(form.get("reason", "")))
    done = _bulk(ctx, query, actor=principal.name, reason=why, dry_run=False)
    return render(request, who, "bulk.html", {"planned": done, "query": query, "done": True})


@router.post("/alerts/{alert_id}/ack")
def acknowledge(
    request: Request,
    acting: Operator,
    ctx: Context,
    alert_id: RowId,
    note: Annotated[str, Form()] = "",
) -> RedirectResponse:
    who, principal = acting
    why = _reason(note)
    act(ctx, lambda conn: alert_ops.acknowledge(conn, alert_id, actor=principal.name, reason=why))
    return redirect(request, who, f"{PREFIX}/alerts/{alert_id}")
