"""Scheduler registrations and the agent fleet under `/v1/schedulers` and `/v1/agents`: the
cluster view, drain and undrain a scheduler (the same ops as `sasflow schedulers`), and the
fleet view (`sasflow agents list`). Cron schedules are `schedules.py`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends

from sasflow.api import responses
from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.models import ACTION_EXAMPLES, OperatorActionRequest
from sasflow.api.openapi import answers, link
from sasflow.ops import agents as agent_ops
from sasflow.ops import pause as pause_ops
from sasflow.ops import registrations

router = APIRouter(tags=["schedulers", "agents"])

Context = Annotated[ApiContext, Depends(get_context)]
Action = Annotated[OperatorActionRequest | None, Body(openapi_examples=ACTION_EXAMPLES)]


@router.get(
    "/v1/schedulers",
    response_model=responses.SchedulerListResponse,
    responses={
        200: {
            "links": {
                "drain_or_undrain_scheduler": link(
                    "drain_or_undrain_scheduler",
                    "Drain or undrain the first scheduler",
                    name="$response.body#/schedulers/0/name",
                )
            }
        },
        **answers(),
    },
)
def list_schedulers(
    ctx: Context, _: Annotated[Principal, Depends(require("read"))]
) -> dict[str, Any]:
    """Per scheduler: name, address, state, K, S, N, X, M and lease age; with the scope
    strategy its leadership, epoch and range, and the plan."""
    return ctx.transaction(
        lambda conn: {
            "schedulers": registrations.cluster_view(conn),
            "plan": registrations.plan_view(conn),
        }
    )


@router.post(
    "/v1/schedulers/{name}/{action}",
    response_model=responses.SchedulerChangedResponse,
    responses=answers("scheduler_not_found", "invalid_action", body=True),
)
def drain_or_undrain_scheduler(
    name: str,
    action: Literal["drain", "undrain"],
    ctx: Context,
    who: Annotated[Principal, Depends(require("operate"))],
    body: Action = None,
) -> dict[str, Any]:
    """`drain`: put it on the offline list, it stops acquiring and releases what it holds
    (404 for a name never registered, 409 if on the list already); `undrain`: take it off,
    it may acquire again (409 if not on the list). Its name and the scheduler as the cluster
    view shows it afterwards."""
    change = registrations.drain if action == "drain" else registrations.undrain
    reason = body.reason if body else None
    ctx.transaction(
        lambda conn: change(conn, name, actor=who.name, reason=reason, namespace=ctx.namespace)
    )
    view = ctx.transaction(registrations.cluster_view)
    return {"name": name, "scheduler": next((s for s in view if s["name"] == name), None)}


@router.get("/v1/agents", response_model=responses.AgentListResponse, responses=answers())
def list_agents(
    ctx: Context,
    _: Annotated[Principal, Depends(require("read"))],
    agent: str | None = None,
    include_stopped: bool = False,
) -> dict[str, Any]:
    """The fleet: agent instances with state, load, last heartbeat and breaker states; the
    paused agents and actions."""
    found, paused = ctx.transaction(
        lambda conn: (
            agent_ops.list_agents(conn, agent=agent, include_stopped=include_stopped),
            pause_ops.paused_agents(conn),
        )
    )
    return {"agents": found, "paused": [p for p in paused if agent in (None, p["agent"])]}
