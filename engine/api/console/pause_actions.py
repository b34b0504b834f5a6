"""The console's pause and resume of a run (buttons on its page) and of an agent or one of its
actions (the agents page), through a confirmation page that says what the action does and asks
for the reason, as schedule_actions.py does; the posts are CSRF-checked, need the `operate`
scope and call ops/pause.py with the signed-in token's name as the actor. Refused (a blank
reason, an ended run), the confirmation page comes back with what was typed and the refusal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from sasflow.api.auth import Principal
from sasflow.api.console import forms
from sasflow.api.console.run_actions import RunAction, act_on_run, confirm_page
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
from sasflow.ops import pause as pause_ops
from sasflow.store.db import Connection

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Context = Annotated[ApiContext, Depends(get_context)]
Operator = Annotated[tuple[Visitor, Principal], Depends(operator)]
Reader = Annotated[Visitor, Depends(reader)]
Action = Literal["pause", "resume"]
Reason = Annotated[str, Form()]

_AGENT_EFFECT = {
    "pause": "No scheduler dispatches its steps: they wait pending with their deadlines not "
    "started (steps in flight finish).",
    "resume": "Its steps are dispatched again (resuming an action leaves a paused agent paused).",
}
_DONE = {"pause": "paused", "resume": "resumed"}


def _pause_run(paused: bool) -> Callable[[Connection, int, str, str, ApiContext], dict[str, Any]]:
    def perform(
        conn: Connection, run_id: int, actor: str, reason: str, ctx: ApiContext
    ) -> dict[str, Any]:
        done = pause_ops.pause_run(conn, run_id, actor=actor, reason=reason, paused=paused)
        if not paused:
            pause_ops.wake(conn, ctx.namespace)
        return done

    return perform


def _said(action: str) -> Callable[[int, dict[str, Any]], str]:
    def message(run_id: int, done: dict[str, Any]) -> str:
        return f"Run {run_id} {_DONE[action]}" + ("" if done["changed"] else " already")

    return message


_RUN_ACTIONS = {
    "pause": RunAction(
        "pause",
        "pausing",
        "Nothing new is dispatched for it: its steps in flight finish and their replies are "
        "applied, its next steps wait pending with their deadlines not started.",
        _pause_run(paused=True),
        _said("pause"),
    ),
    "resume": RunAction(
        "resume",
        "resuming",
        "Its ready steps are dispatched again.",
        _pause_run(paused=False),
        _said("resume"),
    ),
}


@router.get("/runs/{run_id}/pause")
def confirm_run_pause(request: Request, who: Reader, ctx: Context, run_id: RowId) -> HTMLResponse:
    """The confirmation page of a run's pause."""
    return confirm_page(request, who, ctx, run_id, action=_RUN_ACTIONS["pause"])


@router.get("/runs/{run_id}/resume")
def confirm_run_resume(request: Request, who: Reader, ctx: Context, run_id: RowId) -> HTMLResponse:
    """The confirmation page of a run's resume."""
    return confirm_page(request, who, ctx, run_id, action=_RUN_ACTIONS["resume"])


@router.post("/runs/{run_id}/pause", response_model=None)
def pause_run(
    request: Request, acting: Operator, ctx: Context, run_id: RowId, reason: Reason = ""
) -> HTMLResponse | RedirectResponse:
    """Pause the run; back to its page (refused: the confirmation page again)."""
    return act_on_run(request, acting, ctx, run_id, action=_RUN_ACTIONS["pause"], reason=reason)


@router.post("/runs/{run_id}/resume", response_model=None)
def resume_run(
    request: Request, acting: Operator, ctx: Context, run_id: RowId, reason: Reason = ""
) -> HTMLResponse | RedirectResponse:
    """Resume the run; back to its page (refused: the confirmation page again)."""
    return act_on_run(request, acting, ctx, run_id, action=_RUN_ACTIONS["resume"], reason=reason)


def _agent_confirm(name: str, action: str, of: str) -> dict[str, Any]:
    what = f"agent {name}" + (f" action {of}" if of else "")
    query = f"?{urlencode({'action': of})}" if of else ""
    return {
        "title": f"{action.capitalize()} {what}?",
        "facts": {"Agent": name, "Action": of or "every action"},
        "effect": _AGENT_EFFECT[action],
        "target": f"{PREFIX}/agents/{quote(name, safe='')}/{action}{query}",
        "back": f"{PREFIX}/agents",
        "reason_label": f"Reason for {'pausing' if action == 'pause' else 'resuming'}",
        "button": f"Confirm: {action} {what}",
    }


@router.get("/agents/{name}/{action}")
def confirm_agent(
    request: Request,
    who: Reader,
    name: str,
    action: Action,
    of: Annotated[str, Query(alias="action")] = "",
) -> HTMLResponse:
    """The confirmation page of an agent's (or an action's) pause or resume."""
    return render(request, who, "confirm.html", _agent_confirm(name, action, of))


@router.post("/agents/{name}/{action}", response_model=None)
def pause_or_resume_agent(
    *,
    request: Request,
    acting: Operator,
    ctx: Context,
    name: str,
    action: Action,
    of: Annotated[str, Query(alias="action")] = "",
    reason: Reason = "",
) -> HTMLResponse | RedirectResponse:
    """Pause or resume; back to the agents page (refused: the confirmation page again)."""
    who, principal = acting
    try:
        why = forms.reason(reason)
        done = act(
            ctx,
            lambda conn: pause_ops.pause_agent(
                conn,
                name,
                action=of or None,
                actor=principal.name,
                reason=why,
                namespace=ctx.namespace,
                paused=action == "pause",
            ),
        )
    except ConsoleError as exc:
        typed = Typed("confirm", {"reason": reason}, forms.errors_of(exc), exc.status)
        values = {**_agent_confirm(name, action, of), "typed": typed}
        return render(request, who, "confirm.html", values, status=typed.status)
    what = f"Agent {name}" + (f" action {of}" if of else "")
    message = f"{what} {_DONE[action]}" + ("" if done["changed"] else " already")
    return redirect(request, who, f"{PREFIX}/agents", flash=message)
