"""A run's operator actions in the console (pause, resume, unpark, fail: pause_actions.py,
park_actions.py): the confirmation page that says what the action does and asks for the reason,
and the CSRF-checked post that does it with the signed-in token's name as the actor. Refused (a
blank reason, a run in the wrong state), the confirmation page comes back with what was typed
and the refusal; done, the run's page with a one-time message."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse

from sasflow.api.auth import Principal
from sasflow.api.console import forms
from sasflow.api.console.run_view import Typed
from sasflow.api.console.views import PREFIX, ConsoleError, Visitor, act, redirect, render
from sasflow.api.context import ApiContext
from sasflow.ops import runs as run_ops
from sasflow.store.db import Connection


@dataclass(frozen=True)
class RunAction:
    """One action on a run, as its confirmation page and its post see it."""

    verb: str
    """`pause`, `resume`, `unpark`, `fail`: the path segment and the button's word."""
    gerund: str
    """For the reason's label: `Reason for pausing`."""
    effect: str
    """What it does, as the confirmation page says it."""
    perform: Callable[[Connection, int, str, str, ApiContext], dict[str, Any]]
    """(conn, run_id, actor, reason, ctx): the ops call, in the action's transaction."""
    message: Callable[[int, dict[str, Any]], str]
    """(run_id, what `perform` answered): the one-time message on the run's page."""
    facts: Callable[[dict[str, Any]], dict[str, str]] = lambda _run: {}
    """Facts of the run shown besides its workflow and state."""


def _confirm(run: dict[str, Any], action: RunAction) -> dict[str, Any]:
    return {
        "title": f"{action.verb.capitalize()} run {run['id']}?",
        "facts": {
            "Workflow": f"{run['workflow']} v{run['version']}",
            "State": run["state"] + (", paused" if run["paused"] else ""),
            **action.facts(run),
        },
        "effect": action.effect,
        "target": f"{PREFIX}/runs/{run['id']}/{action.verb}",
        "back": f"{PREFIX}/runs/{run['id']}",
        "reason_label": f"Reason for {action.gerund}",
        "button": f"Confirm: {action.verb} run {run['id']}",
    }


def confirm_page(
    request: Request,
    who: Visitor,
    ctx: ApiContext,
    run_id: int,
    *,
    action: RunAction,
    typed: Typed | None = None,
) -> HTMLResponse:
    """The confirmation page of `action` on the run (with `typed`: refused, again)."""
    run = act(ctx, lambda conn: run_ops.show_run(conn, run_id))["run"]
    values = {**_confirm(run, action), "typed": typed}
    return render(request, who, "confirm.html", values, status=typed.status if typed else 200)


def act_on_run(
    request: Request,
    acting: tuple[Visitor, Principal],
    ctx: ApiContext,
    run_id: int,
    *,
    action: RunAction,
    reason: str,
) -> HTMLResponse | RedirectResponse:
    """Do `action` on the run; back to its page (refused: the confirmation page again)."""
    who, principal = acting
    try:
        why = forms.reason(reason)
        done = act(ctx, lambda conn: action.perform(conn, run_id, principal.name, why, ctx))
    except ConsoleError as exc:
        typed = Typed("confirm", {"reason": reason}, forms.errors_of(exc), exc.status)
        return confirm_page(request, who, ctx, run_id, action=action, typed=typed)
    return redirect(request, who, f"{PREFIX}/runs/{run_id}", flash=action.message(run_id, done))
