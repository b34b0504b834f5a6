"""The console's approvals (ops/approvals.py): the Approvals page lists the open ones with
Approve and Reject buttons; each leads to a confirmation page (the approval's form and a
comment, or the reason) whose CSRF-checked post decides it with the signed-in token's name as
the actor. Deciding needs the approval's scope (`approve`, `approve:<group>`, or `admin`), not
`operate`: without it the buttons are disabled and say which scope is needed. Refused (a field,
a blank reason, decided meanwhile), the confirmation page comes back with what was typed and
the refusal; done, the run's page with a one-time message."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from sasflow.api.console import forms
from sasflow.api.console.run_view import Typed
from sasflow.api.console.views import (
    PREFIX,
    ConsoleError,
    Visitor,
    act,
    checked,
    reader,
    redirect,
    render,
)
from sasflow.api.context import ApiContext, get_context
from sasflow.api.validation import RowId
from sasflow.errors import InvalidFormError
from sasflow.ops import approvals as approval_ops
from sasflow.store.db import Connection

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Context = Annotated[ApiContext, Depends(get_context)]
Reader = Annotated[Visitor, Depends(reader)]
Checked = Annotated[Visitor, Depends(checked)]
StepName = Annotated[str, Path(min_length=1, max_length=100)]
_FIELD = "field."
"""The HTML form's names of the approval's fields: `field.<name>`."""


@router.get("/approvals")
def approvals_page(request: Request, who: Reader, ctx: Context) -> HTMLResponse:
    """Open approvals, oldest first, each with its Approve and Reject buttons."""
    found = ctx.transaction(approval_ops.list_open)
    return render(request, who, "approvals.html", {"approvals": found})


def _approval(ctx: ApiContext, run_id: int, step: str) -> dict[str, Any]:
    """The open approval `step` of the run, or ConsoleError 409 (decided, or not open)."""
    found = act(ctx, lambda conn: approval_ops.list_open(conn, run_id=run_id))
    for approval in found:
        if approval["step"] == step:
            return approval
    raise ConsoleError(409, f"run {run_id} has no open approval {step!r}: decided, or not open")


@dataclass(frozen=True)
class _Target:
    """The approval a confirmation page or a post is about, and the decision."""

    run_id: int
    step: str
    verb: str
    """`approve` or `reject`."""


def _confirm(
    request: Request, who: Visitor, ctx: ApiContext, target: _Target, typed: Typed | None = None
) -> HTMLResponse:
    approval = _approval(ctx, target.run_id, target.step)
    may = who.principal is not None and approval_ops.may_decide(
        who.principal.scopes, approval["group"]
    )
    values = {
        "approval": approval,
        "verb": target.verb,
        "may": may,
        "target": f"{PREFIX}/runs/{target.run_id}/steps/{target.step}/{target.verb}",
        "back": f"{PREFIX}/runs/{target.run_id}",
        "typed": typed,
    }
    status = typed.status if typed else 200
    return render(request, who, "approval_confirm.html", values, status=status)


@router.get("/runs/{run_id}/steps/{step}/approve")
def confirm_approve(
    request: Request, who: Reader, ctx: Context, run_id: RowId, step: StepName
) -> HTMLResponse:
    """The confirmation page of approving: the approval's form and a comment."""
    return _confirm(request, who, ctx, _Target(run_id, step, "approve"))


@router.get("/runs/{run_id}/steps/{step}/reject")
def confirm_reject(
    request: Request, who: Reader, ctx: Context, run_id: RowId, step: StepName
) -> HTMLResponse:
    """The confirmation page of rejecting: the reason."""
    return _confirm(request, who, ctx, _Target(run_id, step, "reject"))


@router.post("/runs/{run_id}/steps/{step}/approve", response_model=None)
async def approve(
    request: Request, visitor: Checked, ctx: Context, run_id: RowId, step: StepName
) -> HTMLResponse | RedirectResponse:
    """Approve; back to the run's page (refused: the confirmation page again)."""
    return _decide(request, visitor, ctx, _Target(run_id, step, "approve"), await _posted(request))


@router.post("/runs/{run_id}/steps/{step}/reject", response_model=None)
async def reject(
    request: Request, visitor: Checked, ctx: Context, run_id: RowId, step: StepName
) -> HTMLResponse | RedirectResponse:
    """Reject; back to the run's page (refused: the confirmation page again)."""
    return _decide(request, visitor, ctx, _Target(run_id, step, "reject"), await _posted(request))


async def _posted(request: Request) -> dict[str, str]:
    return {k: v for k, v in (await request.form()).items() if isinstance(v, str)}


def _decide(
    request: Request, visitor: Visitor, ctx: ApiContext, target: _Target, posted: dict[str, str]
) -> HTMLResponse | RedirectResponse:
    who = reader(request, visitor)
    principal = who.principal
    assert principal is not None  # noqa: S101 - `reader` signed them in
    run_id, step = target.run_id, target.step
    fields = {k.removeprefix(_FIELD): v for k, v in posted.items() if k.startswith(_FIELD)}
    comment = posted.get("comment", "").strip() or None
    if target.verb == "approve":
        decision = approval_ops.Decision("approve", fields=fields, comment=comment)
    else:
        decision = approval_ops.Decision("reject", reason=posted.get("reason", "").strip())
    try:
        if target.verb == "reject":
            forms.reason(decision.reason)
        done = _act(
            ctx,
            lambda conn: approval_ops.decide(
                conn,
                run_id,
                step,
                decision,
                actor=principal.name,
                scopes=principal.scopes,
                namespace=ctx.namespace,
                registry=ctx.registry,
            ),
        )
    except RefusedFormError as exc:
        typed = Typed("confirm", posted, exc.errors, exc.status)
        return _confirm(request, who, ctx, target, typed)
    except ConsoleError as exc:
        typed = Typed("confirm", posted, forms.errors_of(exc), exc.status)
        return _confirm(request, who, ctx, target, typed)
    message = f"Run {run_id}: {step} {done['decision']} (run {done['run_state']})"
    return redirect(request, who, f"{PREFIX}/runs/{run_id}", flash=message)


class RefusedFormError(Exception):
    """A refused form: field -> reason, with the HTTP status."""

    def __init__(self, errors: dict[str, str], status: int) -> None:
        super().__init__(errors)
        self.errors = errors
        self.status = status


def _act(ctx: ApiContext, work: Callable[[Connection], dict[str, Any]]) -> dict[str, Any]:
    """`act`, with a refused form's reasons by field (`field.<name>`, `comment`, `reason`)."""

    def guarded(conn: Connection) -> dict[str, Any]:
        try:
            return work(conn)
        except InvalidFormError as exc:
            errors = {
                name if name in {"comment", "reason"} else f"{_FIELD}{name}": message
                for name, message in exc.fields.items()
            }
            raise RefusedFormError(errors, 422) from exc

    return act(ctx, guarded)
