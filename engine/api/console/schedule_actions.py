"""The console's actions on schedules (pause, resume, trigger) and schedulers (drain,
undrain). Each button opens a confirmation page (GET) that says what the action does and asks
for a reason; only its explicit confirm button posts. The posts are CSRF-checked, need the
`operate` scope and call the same service functions as the CLI and the REST API, the
signed-in token's name as the actor; the reason is optional, as in the CLI. After the action
the page it returns to shows what was done (a one-time message, flash.py); refused (a 409:
paused already, not on the offline list), the confirmation page comes back as things are
now, with the reason typed and the refusal in its form (forms.py), in the refusal's status."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from sasflow.api.auth import Principal
from sasflow.api.console import forms
from sasflow.api.console.run_view import Typed
from sasflow.api.console.views import (
    PREFIX,
    ConsoleError,
    Visitor,
    act,
    local,
    operator,
    reader,
    redirect,
    render,
)
from sasflow.api.context import ApiContext, get_context
from sasflow.ops import registrations
from sasflow.ops import schedules as schedule_ops

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Context = Annotated[ApiContext, Depends(get_context)]
Operator = Annotated[tuple[Visitor, Principal], Depends(operator)]
Reader = Annotated[Visitor, Depends(reader)]
Reason = Annotated[str, Form()]
Back = Annotated[str, Form(alias="next")]
ScheduleAction = Literal["pause", "resume", "trigger"]
SchedulerAction = Literal["drain", "undrain"]

_SCHEDULE_EFFECT = {
    "pause": "It stops firing: its ticks are not fired while it is paused.",
    "resume": "It fires again from its next tick (missed ticks follow its catch-up policy).",
    "trigger": "It fires now, once, submitting a run of its workflow; its next tick stays.",
}
_SCHEDULER_EFFECT = {
    "drain": "It goes on the offline list: it stops acquiring schedules and releases those it "
    "holds to the other schedulers.",
    "undrain": "It leaves the offline list and may acquire schedules again.",
}
_DOING = {
    "pause": "pausing",
    "resume": "resuming",
    "trigger": "triggering",
    "drain": "draining",
    "undrain": "undraining",
}
_DONE = {"pause": "paused", "resume": "resumed", "drain": "drained", "undrain": "undrained"}


def _why(reason: str) -> str | None:
    return reason.strip() or None


def _schedule_confirm(found: dict[str, Any], action: str, back: str) -> dict[str, Any]:
    """The confirmation page's values for a schedule's action, the schedule as read now."""
    return {
        "title": f"{action.capitalize()} schedule {found['name']}?",
        "facts": {
            "Workflow": found["workflow"],
            "State": "paused" if found["paused"] else "active",
            "Timing": found["timing"],
        },
        "effect": _SCHEDULE_EFFECT[action],
        "target": f"{PREFIX}/schedules/{found['id']}/{action}",
        "back": local(back) if back else f"{PREFIX}/schedules/{found['id']}",
        "reason_label": f"Reason for {_DOING[action]} (optional)",
        "button": f"Confirm: {action} {found['name']}",
    }


def _scheduler_confirm(name: str, action: str) -> dict[str, Any]:
    """The confirmation page's values for a scheduler's drain or undrain."""
    return {
        "title": f"{action.capitalize()} scheduler {name}?",
        "facts": {},
        "effect": _SCHEDULER_EFFECT[action],
        "target": f"{PREFIX}/schedulers/{quote(name, safe='')}/{action}",
        "back": f"{PREFIX}/schedulers",
        "reason_label": f"Reason for {_DOING[action]} (optional)",
        "button": f"Confirm: {action} {name}",
    }


def _refused(exc: ConsoleError, reason: str) -> Typed:
    return Typed("confirm", {"reason": reason}, forms.errors_of(exc), exc.status)


def _schedule_again(
    request: Request,
    who: Visitor,
    ctx: ApiContext,
    ref: str,
    *,
    action: str,
    back: str,
    typed: Typed,
) -> HTMLResponse:
    """A refused action's confirmation page again, the schedule as it is now, the reason typed
    kept and the refusal in its form (an unknown schedule: the error page)."""
    found = act(ctx, lambda conn: schedule_ops.show(conn, ref))
    values = {**_schedule_confirm(found, action, back), "typed": typed}
    return render(request, who, "confirm.html", values, status=typed.status)


@router.get("/schedules/{ref}/{action}")
def confirm_schedule(
    *,
    request: Request,
    who: Reader,
    ctx: Context,
    ref: str,
    action: ScheduleAction,
    back: Annotated[str, Query(alias="next")] = "",
) -> HTMLResponse:
    """The confirmation page of a schedule's action."""
    found = act(ctx, lambda conn: schedule_ops.show(conn, ref))
    return render(request, who, "confirm.html", _schedule_confirm(found, action, back))


@router.get("/schedulers/{name}/{action}")
def confirm_scheduler(
    request: Request, who: Reader, name: str, action: SchedulerAction
) -> HTMLResponse:
    """The confirmation page of a scheduler's drain or undrain."""
    return render(request, who, "confirm.html", _scheduler_confirm(name, action))


@router.post("/schedules/{ref}/trigger", response_model=None)
def trigger(
    *,
    request: Request,
    acting: Operator,
    ctx: Context,
    ref: str,
    reason: Reason = "",
    back: Back = "",
) -> HTMLResponse | RedirectResponse:
    """Fire it now, once; the schedule's page then shows the tick and its run."""
    who, principal = acting
    try:
        fired = act(
            ctx,
            lambda conn: schedule_ops.trigger(
                conn,
                ref,
                ctx.registry,
                actor=principal.name,
                reason=_why(reason),
                namespace=ctx.namespace,
            ),
        )
    except ConsoleError as exc:
        typed = _refused(exc, reason)
        return _schedule_again(request, who, ctx, ref, action="trigger", back=back, typed=typed)
    location = local(back) if back else f"{PREFIX}/schedules/{fired['schedule_id']}"
    return redirect(request, who, location, flash=_fired(fired))


def _fired(fired: dict[str, Any]) -> str:
    if fired["run_id"] is not None:
        return f"Schedule {fired['name']} triggered: run {fired['run_id']} submitted"
    error = (fired.get("tick") or {}).get("error") or "no run"
    return f"Schedule {fired['name']} triggered, but its tick failed: {error}"


@router.post("/schedules/{ref}/{action}", response_model=None)
def pause_or_resume(
    *,
    request: Request,
    acting: Operator,
    ctx: Context,
    ref: str,
    action: Literal["pause", "resume"],
    reason: Reason = "",
    back: Back = "",
) -> HTMLResponse | RedirectResponse:
    """Pause or resume; back to the page the action started from (refused: its confirmation
    page again)."""
    who, principal = acting
    try:
        found = act(
            ctx,
            lambda conn: schedule_ops.set_paused(
                conn,
                ref,
                paused=action == "pause",
                actor=principal.name,
                reason=_why(reason),
                namespace=ctx.namespace,
            ),
        )
    except ConsoleError as exc:
        typed = _refused(exc, reason)
        return _schedule_again(request, who, ctx, ref, action=action, back=back, typed=typed)
    location = local(back) if back else f"{PREFIX}/schedules"
    return redirect(request, who, location, flash=f"Schedule {found['name']} {_DONE[action]}")


@router.post("/schedulers/{name}/{action}", response_model=None)
def drain_or_undrain(
    *,
    request: Request,
    acting: Operator,
    ctx: Context,
    name: str,
    action: SchedulerAction,
    reason: Reason = "",
) -> HTMLResponse | RedirectResponse:
    """Drain or undrain; back to the schedulers (refused: the confirmation page again)."""
    who, principal = acting
    change = registrations.drain if action == "drain" else registrations.undrain
    why = _why(reason)
    try:
        act(
            ctx,
            lambda conn: change(
                conn, name, actor=principal.name, reason=why, namespace=ctx.namespace
            ),
        )
    except ConsoleError as exc:
        typed = _refused(exc, reason)
        values = {**_scheduler_confirm(name, action), "typed": typed}
        return render(request, who, "confirm.html", values, status=typed.status)
    return redirect(request, who, f"{PREFIX}/schedulers", flash=f"Scheduler {name} {_DONE[action]}")
