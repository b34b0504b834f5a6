"""Schedules: list them, show one, pause, resume and trigger one (the same ops as
`sasflow schedules`). A schedule is named by its id or its name."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Query

from sasflow.api import responses
from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.models import ACTION_EXAMPLES, OperatorActionRequest
from sasflow.api.openapi import answers, link
from sasflow.ops import schedules as schedule_ops

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])

Context = Annotated[ApiContext, Depends(get_context)]
FIRST = "$response.body#/schedules/0/name"
Action = Annotated[OperatorActionRequest | None, Body(openapi_examples=ACTION_EXAMPLES)]


@router.get(
    "",
    response_model=responses.ScheduleListResponse,
    responses={
        200: {
            "links": {
                "show_schedule": link("show_schedule", "The first schedule", ref=FIRST),
                "trigger_schedule": link("trigger_schedule", "Fire it now", ref=FIRST),
                "pause_or_resume_schedule": link(
                    "pause_or_resume_schedule", "Pause or resume it", ref=FIRST
                ),
            }
        },
        **answers(),
    },
)
def list_schedules(
    ctx: Context, _: Annotated[Principal, Depends(require("read"))]
) -> dict[str, Any]:
    """Every schedule with its timing, owner (and whether it is live), next and last tick."""
    return {"schedules": ctx.transaction(schedule_ops.list_schedules)}


@router.get(
    "/{ref}",
    response_model=responses.ScheduleDetailResponse,
    responses=answers("schedule_not_found"),
)
def show_schedule(
    ref: str,
    ctx: Context,
    _: Annotated[Principal, Depends(require("read"))],
    ticks: Annotated[int, Query(ge=1, le=1000)] = schedule_ops.SHOWN_TICKS,
) -> dict[str, Any]:
    """The schedule (id or name): its definition, owner, last ticks with their runs (newest
    first) and next tick."""
    found: dict[str, Any] = ctx.transaction(lambda conn: schedule_ops.show(conn, ref, ticks=ticks))
    return found


@router.post(
    "/{ref}/trigger",
    response_model=responses.TriggeredResponse,
    responses=answers("schedule_not_found", body=True),
)
def trigger_schedule(
    ref: str,
    ctx: Context,
    who: Annotated[Principal, Depends(require("operate"))],
    body: Action = None,
) -> dict[str, Any]:
    """Fire it now, once: the tick with its run id (or the error that kept it from running);
    its next tick does not move."""
    reason = body.reason if body else None
    fired: dict[str, Any] = ctx.transaction(
        lambda conn: schedule_ops.trigger(
            conn, ref, ctx.registry, actor=who.name, reason=reason, namespace=ctx.namespace
        )
    )
    return fired


@router.post(
    "/{ref}/{action}",
    response_model=responses.ScheduleResponse,
    responses=answers("schedule_not_found", "invalid_action", body=True),
)
def pause_or_resume_schedule(
    ref: str,
    action: Literal["pause", "resume"],
    ctx: Context,
    who: Annotated[Principal, Depends(require("operate"))],
    body: Action = None,
) -> dict[str, Any]:
    """`pause`: no tick fires and its scheduler lets it go (409 if paused already);
    `resume`: from its next tick, the ticks missed while paused are not fired (409 if not
    paused). The schedule as it is afterwards."""
    reason = body.reason if body else None
    done: dict[str, Any] = ctx.transaction(
        lambda conn: schedule_ops.set_paused(
            conn,
            ref,
            paused=action == "pause",
            actor=who.name,
            reason=reason,
            namespace=ctx.namespace,
        )
    )
    return done
