"""The console's form posts on schedules (pause, resume, trigger) and schedulers (drain,
undrain): CSRF-checked, `operate` scope, the same service functions as the CLI and the REST
API, the signed-in token's name as the actor. The reason is optional, as in the CLI."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse

from sasflow.api.auth import Principal
from sasflow.api.console.views import PREFIX, Visitor, act, local, operator, redirect
from sasflow.api.context import ApiContext, get_context
from sasflow.ops import schedulers as scheduler_ops
from sasflow.ops import schedules as schedule_ops

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Context = Annotated[ApiContext, Depends(get_context)]
Operator = Annotated[tuple[Visitor, Principal], Depends(operator)]
Reason = Annotated[str, Form()]
Back = Annotated[str, Form(alias="next")]


def _back(target: str, default: str) -> str:
    """Where the form came from (a console page only), else `default`."""
    return local(target) if target else default


def _set_paused(
    request: Request,
    acting: tuple[Visitor, Principal],
    ctx: ApiContext,
    ref: str,
    *,
    paused: bool,
    reason: str,
    back: str,
) -> RedirectResponse:
    who, principal = acting
    act(
        ctx,
        lambda conn: schedule_ops.set_paused(
            conn,
            ref,
            paused=paused,
            actor=principal.name,
            reason=reason.strip() or None,
            namespace=ctx.namespace,
        ),
    )
    return redirect(request, who, _back(back, f"{PREFIX}/schedules"))


@router.post("/schedules/{ref}/pause")
def pause(
    *,
    request: Request,
    acting: Operator,
    ctx: Context,
    ref: str,
    reason: Reason = "",
    back: Back = "",
) -> RedirectResponse:
    return _set_paused(request, acting, ctx, ref, paused=True, reason=reason, back=back)


@router.post("/schedules/{ref}/resume")
def resume(
    *,
    request: Request,
    acting: Operator,
    ctx: Context,
    ref: str,
    reason: Reason = "",
    back: Back = "",
) -> RedirectResponse:
    return _set_paused(request, acting, ctx, ref, paused=False, reason=reason, back=back)


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


@router.post("/schedulers/{name}/drain")
def drain(
    request: Request, acting: Operator, ctx: Context, name: str, reason: Reason = ""
) -> RedirectResponse:
    who, principal = acting
    act(
        ctx,
        lambda conn: scheduler_ops.drain(
            conn, name, actor=principal.name, reason=reason.strip() or None, namespace=ctx.namespace
        ),
    )
    return redirect(request, who, f"{PREFIX}/schedulers")


@router.post("/schedulers/{name}/undrain")
def undrain(
    request: Request, acting: Operator, ctx: Context, name: str, reason: Reason = ""
) -> RedirectResponse:
    who, principal = acting
    act(
        ctx,
        lambda conn: scheduler_ops.undrain(
            conn, name, actor=principal.name, reason=reason.strip() or None, namespace=ctx.namespace
        ),
    )
    return redirect(request, who, f"{PREFIX}/schedulers")
