"""Flow limits: list them, show one, create or replace one, delete one (the same ops as
`sasflow limits`; docs/flow-control.md). Changes need the `operate` scope and are audited with
the token's name and the reason."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Response

from sasflow.api import responses
from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.models import LIMIT_EXAMPLES, LimitRequest
from sasflow.api.openapi import answers, link
from sasflow.api.validation import QueryReason
from sasflow.ops import limits as limit_ops
from sasflow.store.flow.model import LIMIT_NAME, KeyExpr, Limit, parse_rate

router = APIRouter(prefix="/v1/limits", tags=["limits"])

Context = Annotated[ApiContext, Depends(get_context)]
NAME = "$response.body#/name"
LIMIT_LINKS = {
    "show_limit": link("show_limit", "The limit and its live state", name=NAME),
    "delete_limit": link("delete_limit", "Delete it", name=NAME),
}


@router.get(
    "",
    response_model=responses.LimitListResponse,
    responses={
        200: {
            "links": {
                "show_limit": link(
                    "show_limit", "The first limit", name="$response.body#/limits/0/name"
                )
            }
        },
        **answers(),
    },
)
def list_limits(ctx: Context, _: Annotated[Principal, Depends(require("read"))]) -> dict[str, Any]:
    """Every limit, by name, with its live state."""
    return {"limits": ctx.transaction(limit_ops.list_limits)}


@router.get("/{name}", response_model=responses.LimitResponse, responses=answers("limit_not_found"))
def show_limit(
    name: str, ctx: Context, _: Annotated[Principal, Depends(require("read"))]
) -> dict[str, Any]:
    """One limit with its live state (404 if there is none of that name)."""
    found: dict[str, Any] = ctx.transaction(lambda conn: limit_ops.show(conn, name))
    return found


@router.put(
    "/{name}",
    response_model=responses.LimitResponse,
    responses={
        200: {"description": "replaced", "links": LIMIT_LINKS},
        201: {"model": responses.LimitResponse, "description": "created", "links": LIMIT_LINKS},
        **answers("invalid_input", body=True),
    },
)
def put_limit(
    name: Annotated[
        str, Path(pattern=LIMIT_NAME.pattern, description="Lower case, as in metric labels.")
    ],
    body: Annotated[LimitRequest, Body(openapi_examples=LIMIT_EXAMPLES)],
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


@router.delete(
    "/{name}",
    response_model=responses.LimitDeletedResponse,
    responses=answers("limit_not_found"),
)
def delete_limit(
    name: str,
    ctx: Context,
    who: Annotated[Principal, Depends(require("operate"))],
    reason: QueryReason,
) -> dict[str, Any]:
    """Delete the limit (404 if there is none): its steps are claimed without it from the
    next claim."""
    ctx.transaction(
        lambda conn: limit_ops.delete(
            conn, name, actor=who.name, reason=reason, namespace=ctx.namespace
        )
    )
    return {"name": name, "deleted": True}
