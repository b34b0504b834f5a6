"""The console's form posts on schedules (pause, resume, trigger) and schedulers (drain,
undrain): CSRF-checked, `operate` scope, the same service functions as the CLI and the REST
API, the signed-in token's name as the actor. The reason is optional, as in the CLI."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse

from sasflow.api.auth import Principal
from sasflow.api.console.views import PREFIX, Visitor, act, local, operator, redirect
from sasflow.api.context import ApiContext, get_context
from sasflow.ops import registrations
from sasflow.ops import schedules as schedule_ops

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Context = Annotated[ApiContext, Depends(get_context)]
Operator = Annotated[tuple[Visitor, Principal], Depends(operator)]
Reason = Annotated[str, Form()]
Back = Annotated[str, Form(alias="next")]


@router.post("/schedules/{ref}/trigger")
def trigger(
    request: Request, acting: Operator, ctx: Context, ref: str, reason: Reason = ""
) -> RedirectResponse:
    """Fire it now, once; the schedule's page then shows the tick and its run."""
    who, principal = acting
    fired = act(
        ctx,
        lambda conn: schedule_ops.trigger(
            conn,
            ref,
            ctx.registry,
            actor=principal.name,
            reason=reason.strip() or None,
            namespace=ctx.namespace,
        ),
    )
    return redirect(request, who, f"{PREFIX}/schedules/{fired['schedule_id']}")


@router.post("/schedules/{ref}/{action}")
def pause_or_resume(
    *,
    request: Request,
    acting: Operator,
    ctx: Context,
    ref: str,
    action: Literal["pause", "resume"],
    reason: Reason = "",
    back: Back = "",
) -> RedirectResponse:
    """Pause or resume; back to the page the form was on."""
    who, principal = acting
    act(
        ctx,
        lambda conn: schedule_ops.set_paused(
            conn,
            ref,
            paused=action == "pause",
            actor=principal.name,
            reason=reason.strip() or None,
            namespace=ctx.namespace,
        ),
    )
    return redirect(request, who, local(back) if back else f"{PREFIX}/schedules")


@router.post("/schedulers/{name}/{action}")
def drain_or_undrain(
    *,
    request: Request,
    acting: Operator,
    ctx: Context,
    name: str,
    action: Literal["drain", "undrain"],
    reason: Reason = "",
) -> RedirectResponse:
    who, principal = acting
    change = registrations.drain if action == "drain" else registrations.undrain
    why = reason.strip() or None
    act(
        ctx,
        lambda conn: change(conn, name, actor=principal.name, reason=why, namespace=ctx.namespace),
    )
    return redirect(request, who, f"{PREFIX}/schedulers")
