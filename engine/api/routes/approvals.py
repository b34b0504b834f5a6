"""Approvals (`Step.approval`): `GET /v1/approvals` lists the open ones (scope `read`),
`POST /v1/runs/{id}/steps/{step}/approve|reject` decides one: the same service as
`sasflow approvals` (ops/approvals.py; docs/api.md). Deciding needs the approval's scope,
`approve` or `approve:<group>` (or `admin`): 403 says which; a refused form 422 with one
`{field, message}` per field; a decided (or not open) approval 409."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query

from sasflow.api import responses
from sasflow.api.auth import Principal, authenticated, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.errors import ApiError
from sasflow.api.models import APPROVE_EXAMPLES, REJECT_EXAMPLES, ApproveRequest, RejectRequest
from sasflow.api.openapi import answers
from sasflow.api.validation import RowId
from sasflow.errors import InvalidFormError
from sasflow.ops import approvals as approval_ops
from sasflow.store.db import Connection

router = APIRouter(tags=["approvals"])

Context = Annotated[ApiContext, Depends(get_context)]
Approver = Annotated[Principal, Depends(authenticated("approve"))]
StepName = Annotated[str, Path(min_length=1, max_length=100)]
_DECIDED = answers("run_not_found", "approval_not_found", "invalid_action", body=True)


@router.get("/v1/approvals", response_model=responses.ApprovalListResponse, responses=answers())
def list_approvals(
    ctx: Context,
    _: Annotated[Principal, Depends(require("read"))],
    workflow: Annotated[str | None, Query(max_length=100)] = None,
    group: Annotated[str | None, Query(max_length=50)] = None,
    limit: Annotated[int, Query(ge=1, le=approval_ops.MAX_LISTED)] = 100,
) -> dict[str, Any]:
    """Open approvals, oldest first, with their form and the scope deciding them needs;
    `workflow`, `group`: only those."""
    found = ctx.transaction(
        lambda conn: approval_ops.list_open(conn, workflow=workflow, group=group, limit=limit)
    )
    return {"approvals": found}


@router.post(
    "/v1/runs/{run_id}/steps/{step}/approve",
    response_model=responses.ApprovalDecisionResponse,
    responses=_DECIDED,
)
def approve(
    run_id: RowId,
    step: StepName,
    body: Annotated[ApproveRequest, Body(openapi_examples=APPROVE_EXAMPLES)],
    ctx: Context,
    who: Approver,
) -> dict[str, Any]:
    """Approve an open approval with its form's fields: the step is processed with them and
    `{decision, by, at, comment}` as its output, and the run goes on."""
    decision = approval_ops.Decision("approve", fields=body.fields, comment=body.comment)
    return _decide(ctx, who, (run_id, step), decision)


@router.post(
    "/v1/runs/{run_id}/steps/{step}/reject",
    response_model=responses.ApprovalDecisionResponse,
    responses=_DECIDED,
)
def reject(
    run_id: RowId,
    step: StepName,
    body: Annotated[RejectRequest, Body(openapi_examples=REJECT_EXAMPLES)],
    ctx: Context,
    who: Approver,
) -> dict[str, Any]:
    """Reject an open approval with a reason: the step fails (or parks, when its policy parks
    permanent errors) and the run follows its failure policy."""
    return _decide(ctx, who, (run_id, step), approval_ops.Decision("reject", reason=body.reason))


def _decide(
    ctx: ApiContext, who: Principal, at: tuple[int, str], decision: approval_ops.Decision
) -> dict[str, Any]:
    def work(conn: Connection) -> dict[str, Any]:
        return approval_ops.decide(
            conn,
            *at,
            decision,
            actor=who.name,
            scopes=who.scopes,
            namespace=ctx.namespace,
            registry=ctx.registry,
        )

    try:
        done: dict[str, Any] = ctx.transaction(work)
    except InvalidFormError as exc:
        raise ApiError(
            422,
            "validation_error",
            f"invalid approval: {exc}",
            extra={
                "fields": [
                    {"field": _field(name), "message": message}
                    for name, message in sorted(exc.fields.items())
                ]
            },
        ) from exc
    return done


def _field(name: str) -> str:
    """Where a refused value is in the body: `body.comment`, `body.reason`, `body.fields.<f>`."""
    return f"body.{name}" if name in {"comment", "reason"} else f"body.fields.{name}"
