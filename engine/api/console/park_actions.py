"""The console's unpark and fail of a parked run (buttons on its page): a confirmation page
that says what the action does and asks for the reason, then a CSRF-checked post that needs the
`operate` scope and calls ops/park.py with the signed-in token's name as the actor (the shared
mechanics: run_actions.py). Refused (a blank reason, nothing parked to fail), the confirmation
page comes back with what was typed and the refusal."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from sasflow.api.auth import Principal
from sasflow.api.console.run_actions import RunAction, act_on_run, confirm_page
from sasflow.api.console.views import PREFIX, Visitor, operator, reader
from sasflow.api.context import ApiContext, get_context
from sasflow.api.validation import RowId
from sasflow.ops import park as park_ops
from sasflow.store.db import Connection

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Context = Annotated[ApiContext, Depends(get_context)]
Operator = Annotated[tuple[Visitor, Principal], Depends(operator)]
Reader = Annotated[Visitor, Depends(reader)]
Reason = Annotated[str, Form()]


def _park_action(verb: str, gerund: str, effect: str, done: str) -> RunAction:
    ops = park_ops.unpark_run if verb == "unpark" else park_ops.fail_run

    def perform(
        conn: Connection, run_id: int, actor: str, reason: str, ctx: ApiContext
    ) -> dict[str, Any]:
        return ops(conn, run_id, actor=actor, reason=reason, namespace=ctx.namespace)

    def message(run_id: int, answer: dict[str, Any]) -> str:
        if not answer["changed"]:
            return f"Run {run_id}: nothing parked"
        return f"Run {run_id} {done}: {', '.join(answer['steps'])}"

    return RunAction(
        verb,
        gerund,
        effect,
        perform,
        message,
        facts=lambda run: {"Parked": ", ".join(run["parked"]) or "nothing"},
    )


_ACTIONS = {
    "unpark": _park_action(
        "unpark",
        "unparking",
        "Its parked steps are pending again with a fresh failure budget and are "
        "dispatched: do it once their partner is fixed.",
        "unparked",
    ),
    "fail": _park_action(
        "fail",
        "failing",
        "Its parked steps go to error and the run ends as its failure policy says: error "
        "with an alert, or compensation.",
        "failed",
    ),
}


@router.get("/runs/{run_id}/unpark")
def confirm_unpark(request: Request, who: Reader, ctx: Context, run_id: RowId) -> HTMLResponse:
    """The confirmation page of a run's unpark."""
    return confirm_page(request, who, ctx, run_id, action=_ACTIONS["unpark"])


@router.get("/runs/{run_id}/fail")
def confirm_fail(request: Request, who: Reader, ctx: Context, run_id: RowId) -> HTMLResponse:
    """The confirmation page of failing a parked run."""
    return confirm_page(request, who, ctx, run_id, action=_ACTIONS["fail"])


@router.post("/runs/{run_id}/unpark", response_model=None)
def unpark_run(
    request: Request, acting: Operator, ctx: Context, run_id: RowId, reason: Reason = ""
) -> HTMLResponse | RedirectResponse:
    """Unpark the run; back to its page (refused: the confirmation page again)."""
    return act_on_run(request, acting, ctx, run_id, action=_ACTIONS["unpark"], reason=reason)


@router.post("/runs/{run_id}/fail", response_model=None)
def fail_run(
    request: Request, acting: Operator, ctx: Context, run_id: RowId, reason: Reason = ""
) -> HTMLResponse | RedirectResponse:
    """Fail the parked run; back to its page (refused: the confirmation page again)."""
    return act_on_run(request, acting, ctx, run_id, action=_ACTIONS["fail"], reason=reason)
