"""The console's unpark and fail of a parked run (buttons on its page), through a confirmation
page that says what the action does and asks for the reason, as pause_actions.py does; the
posts are CSRF-checked, need the `operate` scope and call ops/park.py with the signed-in
token's name as the actor. Refused (a blank reason, nothing parked to fail), the confirmation
page comes back with what was typed and the refusal."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from sasflow.api.auth import Principal
from sasflow.api.console import forms
from sasflow.api.console.run_view import Typed
from sasflow.api.console.views import (
    PREFIX,
    ConsoleError,
    Visitor,
    act,
    operator,
    reader,
    redirect,
    render,
)
from sasflow.api.context import ApiContext, get_context
from sasflow.api.validation import RowId
from sasflow.ops import park as park_ops
from sasflow.ops import runs as run_ops

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Context = Annotated[ApiContext, Depends(get_context)]
Operator = Annotated[tuple[Visitor, Principal], Depends(operator)]
Reader = Annotated[Visitor, Depends(reader)]
Action = Literal["unpark", "fail"]
Reason = Annotated[str, Form()]

_EFFECT = {
    "unpark": "Its parked steps are pending again with a fresh failure budget and are "
    "dispatched: do it once their partner is fixed.",
    "fail": "Its parked steps go to error and the run ends as its failure policy says: error "
    "with an alert, or compensation.",
}
_DONE = {"unpark": "unparked", "fail": "failed"}
_ACTIONS = {"unpark": park_ops.unpark_run, "fail": park_ops.fail_run}


def _confirm(run: dict[str, Any], action: str) -> dict[str, Any]:
    return {
        "title": f"{action.capitalize()} run {run['id']}?",
        "facts": {
            "Workflow": f"{run['workflow']} v{run['version']}",
            "State": run["state"] + (", paused" if run["paused"] else ""),
            "Parked": ", ".join(run["parked"]) or "nothing",
        },
        "effect": _EFFECT[action],
        "target": f"{PREFIX}/runs/{run['id']}/{action}",
        "back": f"{PREFIX}/runs/{run['id']}",
        "reason_label": f"Reason for {'unparking' if action == 'unpark' else 'failing'}",
        "button": f"Confirm: {action} run {run['id']}",
    }


def _page(
    request: Request,
    who: Visitor,
    ctx: ApiContext,
    run_id: int,
    *,
    action: str,
    typed: Typed | None = None,
) -> HTMLResponse:
    run = act(ctx, lambda conn: run_ops.show_run(conn, run_id))["run"]
    values = {**_confirm(run, action), "typed": typed}
    return render(request, who, "confirm.html", values, status=typed.status if typed else 200)


@router.get("/runs/{run_id}/unpark")
def confirm_unpark(request: Request, who: Reader, ctx: Context, run_id: RowId) -> HTMLResponse:
    """The confirmation page of a run's unpark."""
    return _page(request, who, ctx, run_id, action="unpark")


@router.get("/runs/{run_id}/fail")
def confirm_fail(request: Request, who: Reader, ctx: Context, run_id: RowId) -> HTMLResponse:
    """The confirmation page of failing a parked run."""
    return _page(request, who, ctx, run_id, action="fail")


@router.post("/runs/{run_id}/unpark", response_model=None)
def unpark_run(
    request: Request, acting: Operator, ctx: Context, run_id: RowId, reason: Reason = ""
) -> HTMLResponse | RedirectResponse:
    """Unpark the run; back to its page (refused: the confirmation page again)."""
    return _act_on_run(request, acting, ctx, run_id, action="unpark", reason=reason)


@router.post("/runs/{run_id}/fail", response_model=None)
def fail_run(
    request: Request, acting: Operator, ctx: Context, run_id: RowId, reason: Reason = ""
) -> HTMLResponse | RedirectResponse:
    """Fail the parked run; back to its page (refused: the confirmation page again)."""
    return _act_on_run(request, acting, ctx, run_id, action="fail", reason=reason)


def _act_on_run(
    request: Request,
    acting: tuple[Visitor, Principal],
    ctx: ApiContext,
    run_id: int,
    *,
    action: Action,
    reason: str,
) -> HTMLResponse | RedirectResponse:
    who, principal = acting
    try:
        why = forms.reason(reason)
        done = act(
            ctx,
            lambda conn: _ACTIONS[action](
                conn, run_id, actor=principal.name, reason=why, namespace=ctx.namespace
            ),
        )
    except ConsoleError as exc:
        typed = Typed("confirm", {"reason": reason}, forms.errors_of(exc), exc.status)
        return _page(request, who, ctx, run_id, action=action, typed=typed)
    message = (
        f"Run {run_id} {_DONE[action]}: {', '.join(done['steps'])}"
        if done["changed"]
        else f"Run {run_id}: nothing parked"
    )
    return redirect(request, who, f"{PREFIX}/runs/{run_id}", flash=message)
