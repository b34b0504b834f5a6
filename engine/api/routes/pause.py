"""Pause and resume runs (`/v1/runs/{id}/pause|resume`) and agents or their actions
(`/v1/agents/{name}/pause|resume`): the same ops as `sasflow runs pause` and `sasflow agents
pause` (docs/operations.md). They need the `operate` scope; a run's are events of its timeline,
an agent's are audited, with the token's name and the reason."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path

from sasflow.api import responses
from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.models import (
    AGENT_PAUSE_EXAMPLES,
    PAUSE_EXAMPLES,
    AgentPauseRequest,
    PauseRequest,
)
from sasflow.api.openapi import answers
from sasflow.api.validation import RowId
from sasflow.ops import pause as pause_ops
from sasflow.store.db import Connection
from sasflow.workflow import NAME_PATTERN

router = APIRouter(tags=["runs", "agents"])

Context = Annotated[ApiContext, Depends(get_context)]
Operator = Annotated[Principal, Depends(require("operate"))]
RunBody = Annotated[PauseRequest, Body(openapi_examples=PAUSE_EXAMPLES)]
AgentBody = Annotated[AgentPauseRequest, Body(openapi_examples=AGENT_PAUSE_EXAMPLES)]
AgentName = Annotated[str, Path(pattern=NAME_PATTERN.pattern, max_length=100)]


def _run(ctx: ApiContext, run_id: int, body: PauseRequest, who: Principal, *, paused: bool) -> Any:
    def act(conn: Connection) -> dict[str, Any]:
        done = pause_ops.pause_run(conn, run_id, actor=who.name, reason=body.reason, paused=paused)
        if not paused:
            pause_ops.wake(conn, ctx.namespace)
        return done

    done = ctx.transaction(act)
    return {"id": run_id, **{k: done[k] for k in ("state", "paused", "changed")}}


@router.post(
    "/v1/runs/{run_id}/pause",
    response_model=responses.RunPausedResponse,
    responses=answers("run_not_found", "invalid_action", body=True),
)
def pause_run(run_id: RowId, body: RunBody, ctx: Context, who: Operator) -> dict[str, Any]:
    """Pause a run: nothing new is dispatched for it (steps in flight finish, their successors
    wait pending); 409 for a run that ended."""
    done: dict[str, Any] = _run(ctx, run_id, body, who, paused=True)
    return done


@router.post(
    "/v1/runs/{run_id}/resume",
    response_model=responses.RunPausedResponse,
    responses=answers("run_not_found", "invalid_action", body=True),
)
def resume_run(run_id: RowId, body: RunBody, ctx: Context, who: Operator) -> dict[str, Any]:
    """Resume a paused run: its ready steps are dispatched again."""
    done: dict[str, Any] = _run(ctx, run_id, body, who, paused=False)
    return done


def _agent(
    ctx: ApiContext, name: str, body: AgentPauseRequest, who: Principal, *, paused: bool
) -> Any:
    return ctx.transaction(
        lambda conn: pause_ops.pause_agent(
            conn,
            name,
            action=body.action,
            actor=who.name,
            reason=body.reason,
            namespace=ctx.namespace,
            paused=paused,
        )
    )


@router.post(
    "/v1/agents/{name}/pause",
    response_model=responses.AgentPausedResponse,
    responses=answers("invalid_action", body=True),
)
def pause_agent(name: AgentName, body: AgentBody, ctx: Context, who: Operator) -> dict[str, Any]:
    """Pause an agent, or one of its actions: no scheduler dispatches its steps, which wait
    pending with their deadlines not started."""
    done: dict[str, Any] = _agent(ctx, name, body, who, paused=True)
    return done


@router.post(
    "/v1/agents/{name}/resume",
    response_model=responses.AgentPausedResponse,
    responses=answers("invalid_action", body=True),
)
def resume_agent(name: AgentName, body: AgentBody, ctx: Context, who: Operator) -> dict[str, Any]:
    """Resume a paused agent or action (resuming an action leaves a paused agent paused)."""
    done: dict[str, Any] = _agent(ctx, name, body, who, paused=False)
    return done
