"""The console's form posts: sign in and out, cancel and resubmit a run, acknowledge an alert
(bulk actions: bulk.py). Every post carries the session's CSRF token; the actions
need the `operate` scope and call the same service functions as the CLI and the REST API."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from sasflow.api.auth import Principal
from sasflow.api.console import forms, live
from sasflow.api.console.forms import FieldError
from sasflow.api.console.run_view import Typed
from sasflow.api.console.session import Session, SessionCodec
from sasflow.api.console.views import (
    PREFIX,
    ConsoleError,
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
from sasflow.states import RunState

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Context = Annotated[ApiContext, Depends(get_context)]
Checked = Annotated[Visitor, Depends(checked)]
Operator = Annotated[tuple[Visitor, Principal], Depends(operator)]


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
        # The page it was going to is kept; the token is not shown again (a secret).
        values = {"next": local(target), "error": message}
        return render(request, who, "login.html", values, status=401)
    session = Session(csrf=who.session.csrf, token_hash=tokens.hash_token(token.strip()))
    return redirect(request, Visitor(session), local(target))


@router.post("/logout")
def logout(_: Checked) -> RedirectResponse:
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    SessionCodec.clear(response)
    return response


@router.post("/runs/{run_id}/cancel", response_model=None)
def cancel(
    *,
    request: Request,
    acting: Operator,
    ctx: Context,
    run_id: RowId,
    reason: Annotated[str, Form()] = "",
    compensate: Annotated[bool, Form()] = False,
) -> HTMLResponse | RedirectResponse:
    who, principal = acting
    try:
        why = forms.reason(reason)
        done = act(
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
    except ConsoleError as exc:  # the run page again, what was typed kept
        typed = Typed("cancel", {"reason": reason, "compensate": compensate}, forms.errors_of(exc))
        return live.run_page(request, who, ctx, run_id, typed=typed, status=exc.status)
    message = f"Run {run_id} cancelled"
    if done.state != RunState.CANCELLED:
        message += f": {done.state} (its processed steps are undone)"
    return redirect(request, who, f"{PREFIX}/runs/{run_id}", flash=message)


@router.post("/runs/{run_id}/resubmit", response_model=None)
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
) -> HTMLResponse | RedirectResponse:
    """Resubmit from the failed steps or `from_step`; an edited input must be a JSON object
    (checked here, then against the message limits by the service function). Refused, the
    run page comes back with what was typed and the error next to its field."""
    who, principal = acting
    try:
        why = forms.reason(reason)
        new_input = _edited_input(edited, original_input)
        done = act(
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
    except ConsoleError as exc:
        values = {"from_step": from_step, "input": edited or original_input, "reason": reason}
        typed = Typed("resubmit", values, forms.errors_of(exc))
        return live.run_page(request, who, ctx, run_id, typed=typed, status=exc.status)
    steps = ", ".join(done.reset_steps) or "none"
    message = f"Run {run_id} resubmitted: steps redone {steps}"
    return redirect(request, who, f"{PREFIX}/runs/{run_id}", flash=message)


def _edited_input(text: str, original: str) -> Any:
    """The corrected input, or None when the field was left as it was shown."""
    if not text.strip() or _same_json(text, original):
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise FieldError("input", f"the edited input is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise FieldError("input", "the edited input must be a JSON object")
    return value


def _same_json(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


@router.post("/alerts/{alert_id}/ack", response_model=None)
def acknowledge(
    request: Request,
    acting: Operator,
    ctx: Context,
    alert_id: RowId,
    note: Annotated[str, Form()] = "",
) -> HTMLResponse | RedirectResponse:
    who, principal = acting
    try:
        why = forms.reason(note, "note")
        act(
            ctx,
            lambda conn: alert_ops.acknowledge(conn, alert_id, actor=principal.name, reason=why),
        )
    except ConsoleError as exc:  # the alert page again, the note kept
        found = act(ctx, lambda conn: alert_ops.show_alert(conn, alert_id))
        typed = Typed("ack", {"note": note}, forms.errors_of(exc))
        return render(
            request, who, "alert.html", {"alert": found, "typed": typed}, status=exc.status
        )
    message = f"Alert #{alert_id} acknowledged"
    return redirect(request, who, f"{PREFIX}/alerts/{alert_id}", flash=message)
