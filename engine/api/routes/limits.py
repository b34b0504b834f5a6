"""Flow limits: list them, show one, create or replace one, delete one (the same ops as
`sasflow limits`; docs/flow-control.md). Changes need the `operate` scope and are audited with
the token's name and the reason."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response

from sasflow.api import responses
from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.models import LimitRequest
from sasflow.ops import limits as limit_ops
from sasflow.store.flow.model import KeyExpr, Limit, parse_rate

router = APIRouter(prefix="/v1/limits", tags=["limits"])

Context = Annotated[ApiContext, Depends(get_context)]


@router.get("", response_model=responses.LimitListResponse)
def list_limits(ctx: Context, _: Annotated[Principal, Depends(require("read"))]) -> dict[str, Any]:
    """Every limit, by name, with its live state."""
    return {"limits": ctx.transaction(limit_ops.list_limits)}


@router.get("/{name}", response_model=responses.LimitResponse)
def show_limit(
    name: str, ctx: Context, _: Annotated[Principal, Depends(require("read"))]
) -> dict[str, Any]:
    """One limit with its live state (404 if there is none of that name)."""
    found: dict[str, Any] = ctx.transaction(lambda conn: limit_ops.show(conn, name))
    return found


@router.put(
    "/{name}",
    response_model=responses.LimitResponse,
    responses={201: {"model": responses.LimitResponse, "description": "created"}},
)
def put_limit(
    name: str,
    body: LimitRequest,
    response: Response,
    ctx: Context,
    who: Annotated[Principal, Depends(require("operate"))],
) -> dict[str, Any]:
    """Create (201) or replace (200) the limit: the whole definition; a definition the engine
    refuses is a 400 that says why."""
    limit = Limit(
        name=name,
        agent=body.agent,
        actions=None if body.actions is None else tuple(body.actions),
        dependency=body.dependency,
        key=None if body.key is None else KeyExpr.parse(body.key),
        rate=parse_rate(body.rate) if isinstance(body.rate, str) else body.rate,
        burst=body.burst,
        concurrency=body.concurrency,
        enabled=body.enabled,
    )
    done: dict[str, Any] = ctx.transaction(
        lambda conn: limit_ops.set_limit(
            conn, limit, actor=who.name, reason=body.reason, namespace=ctx.namespace
        )
    )
    if done["created"]:
        response.status_code = 201
    return done


@router.delete("/{name}", response_model=responses.LimitDeletedResponse)
def delete_limit(
    name: str,
    ctx: Context,
    who: Annotated[Principal, Depends(require("operate"))],
    reason: Annotated[str, Query(min_length=1, max_length=2000, description="Why (audited).")],
) -> dict[str, Any]:
    """Delete the limit (404 if there is none): its steps are claimed without it from the
    next claim."""
    ctx.transaction(
        lambda conn: limit_ops.delete(
            conn, name, actor=who.name, reason=reason, namespace=ctx.namespace
        )
    )
    return {"name": name, "deleted": True}
