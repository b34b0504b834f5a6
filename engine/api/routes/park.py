"""Unpark and fail parked runs (`/v1/runs/{id}/unpark|fail`): the same ops as `sasflow runs
unpark|fail` (docs/operations.md "Parked steps"). They need the `operate` scope; each is an
event of the run's timeline with the token's name and the reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends

from sasflow.api import responses
from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.models import PARK_EXAMPLES, ParkRequest
from sasflow.api.openapi import answers
from sasflow.api.validation import RowId
from sasflow.ops import park as park_ops

router = APIRouter(tags=["runs"])

Context = Annotated[ApiContext, Depends(get_context)]
Operator = Annotated[Principal, Depends(require("operate"))]
ParkBody = Annotated[ParkRequest, Body(openapi_examples=PARK_EXAMPLES)]


def _act(
    ctx: ApiContext,
    run_id: int,
    body: ParkRequest,
    who: Principal,
    action: Callable[..., dict[str, Any]],
) -> dict[str, Any]:
    done = ctx.transaction(
        lambda conn: action(
            conn, run_id, actor=who.name, reason=body.reason, namespace=ctx.namespace
        )
    )
    return {"id": run_id, **{k: done[k] for k in ("state", "steps", "changed")}}


@router.post(
    "/v1/runs/{run_id}/unpark",
    response_model=responses.RunParkResponse,
    responses=answers("run_not_found", "invalid_action", body=True),
)
def unpark_run(run_id: RowId, body: ParkBody, ctx: Context, who: Operator) -> dict[str, Any]:
    """Unpark a run: its parked steps are pending again with a fresh failure budget and are
    dispatched; `changed` false when it had none."""
    return _act(ctx, run_id, body, who, park_ops.unpark_run)


@router.post(
    "/v1/runs/{run_id}/fail",
    response_model=responses.RunParkResponse,
    responses=answers("run_not_found", "invalid_action", body=True),
)
def fail_run(run_id: RowId, body: ParkBody, ctx: Context, who: Operator) -> dict[str, Any]:
    """Fail a parked run: its parked steps go to error and the run ends as its failure policy
    says (error with a `step_failed` alert, or compensation); 409 for a run with no parked
    step."""
    return _act(ctx, run_id, body, who, park_ops.fail_run)
