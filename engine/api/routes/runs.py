"""REST tasks: submit, read, list, cancel and resubmit runs (the same ops as the CLI)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Response

from sasflow.api import responses
from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.errors import ApiError
from sasflow.api.models import (
    BATCH_EXAMPLES,
    CANCEL_EXAMPLES,
    RESUBMIT_EXAMPLES,
    RUN_EXAMPLES,
    BatchRequest,
    CancelRequest,
    ResubmitRequest,
    RunRequest,
)
from sasflow.api.openapi import answers, link
from sasflow.api.validation import Cursor, MapItemsShown, RowId
from sasflow.commands import NewRun, Refused, SubmitResult
from sasflow.errors import BacklogFullError, InvalidInputError, UnknownWorkflowError
from sasflow.ops import cancel as cancel_ops
from sasflow.ops import resubmit as resubmit_ops
from sasflow.ops import runs as run_ops
from sasflow.ops import submit as submit_ops
from sasflow.ops.map_items import DEFAULT_SHOWN
from sasflow.states import RunState
from sasflow.store.db import Connection
from sasflow.store.operator.inspect import RunFilter

router = APIRouter(prefix="/v1/runs", tags=["runs"])

LAST_EVENTS = 50
"""Events of a run that GET /v1/runs/{id} returns (the latest)."""
MAX_PAGE = 500

Context = Annotated[ApiContext, Depends(get_context)]
RUN_ID = "$response.body#/id"
RUN_LINKS = {
    "get_run": link("get_run", "The run, its steps and events", run_id=RUN_ID),
    "cancel_run": link("cancel_run", "Cancel it", run_id=RUN_ID),
    "resubmit_run": link("resubmit_run", "Run it again", run_id=RUN_ID),
}
LOCATION = {
    "Location": {
        "description": "The run's path: `/v1/runs/{id}`.",
        "required": True,
        "schema": {"type": "string"},
    }
}


@router.post(
    "",
    status_code=201,
    response_model=responses.SubmittedResponse,
    responses={
        201: {"description": "a new run", "headers": LOCATION, "links": RUN_LINKS},
        200: {
            "model": responses.SubmittedResponse,
            "description": "the existing run of the same (workflow, key)",
            "headers": LOCATION,
            "links": RUN_LINKS,
        },
        **answers(
            "invalid_input",
            "callbacks_disabled",
            "unknown_workflow",
            "backlog_full",
            body=True,
        ),
    },
)
def submit_run(
    body: Annotated[RunRequest, Body(openapi_examples=RUN_EXAMPLES)],
    response: Response,
    ctx: Context,
    who: Annotated[Principal, Depends(require("submit"))],
) -> dict[str, Any]:
    """Submit a run: 201 with `Location` and the run, or 200 with the run the key maps to
    (`input_differs` true, and a `message`, when that run was recorded with another input);
    429 with `Retry-After` while the workflow's backlog is at its bound."""
    if body.callback_url is not None:
        _callbacks_allowed(ctx, "")
    new = _new_run(body, who)

    def work(conn: Connection) -> tuple[SubmitResult, dict[str, Any]]:
        result = submit_ops.submit_run(
            conn,
            ctx.registry,
            new,
            actor=who.name,
            namespace=ctx.namespace,
            limits=ctx.limits,
            backlog=ctx.backlog,
        )
        return result, run_ops.get_run(conn, result.run_id)

    try:
        result, run = ctx.transaction(work)
    except UnknownWorkflowError as exc:
        known = submit_ops.known_workflows(ctx.registry)
        raise ApiError(
            404,
            "unknown_workflow",
            f"{exc}; known workflows: {', '.join(known) or 'none'}",
            extra={"known": known},
        ) from exc
    except BacklogFullError as exc:
        ctx.hooks.submissions_refused(exc.workflow, "api", 1)
        raise ApiError(
            429,
            "backlog_full",
            str(exc),
            headers={"Retry-After": str(exc.retry_after)},
            extra={
                "workflow": exc.workflow,
                "backlog": exc.backlog,
                "max_backlog": exc.bound,
                "retry_after": exc.retry_after,
            },
        ) from exc
    if not result.created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/runs/{run['id']}"
    return {
        "id": run["id"],
        "created": result.created,
        "input_differs": result.input_differs,
        "message": result.conflict(body.workflow),
        "run": run,
    }


def _new_run(body: RunRequest, who: Principal) -> NewRun:
    return NewRun(
        workflow=body.workflow,
        input=body.input,
        key=body.key,
        priority=body.priority,
        version=body.version,
        submitted_by=who.name,
        callback_url=None if body.callback_url is None else str(body.callback_url),
        pool=body.pool,
        start_at=body.start_at,
    )


def _callbacks_allowed(ctx: ApiContext, which: str) -> None:
    """400 callbacks_disabled when this server cannot sign callbacks (`which`: the runs of a
    batch that asked for one)."""
    if ctx.settings.api_callback_secret is None:
        raise ApiError(
            400,
            "callbacks_disabled",
            "this server has no callback key (SASFLOW_API_CALLBACK_SECRET): it cannot sign "
            f"callbacks, so it refuses runs with a callback_url{which}",
        )


@router.post(
    "/batch",
    response_model=responses.BatchSubmittedResponse,
    responses=answers("callbacks_disabled", body=True),
)
def submit_runs(
    body: Annotated[BatchRequest, Body(openapi_examples=BATCH_EXAMPLES)],
    response: Response,
    ctx: Context,
    who: Annotated[Principal, Depends(require("submit"))],
) -> dict[str, Any]:
    """Submit up to 1,000 runs in one transaction (one statement where their workflows
    allow it): 200 with one answer per run, in order: `created`, `duplicate` (the run its key
    maps to) or `refused` with the code `POST /v1/runs` would answer (`invalid_input`,
    `unknown_workflow`, `backlog_full` with `retry_after`; then the answer has a `Retry-After`
    header too). A body that does not validate is refused whole (422, each problem's field
    naming the run's index, e.g. `runs.3.workflow`)."""
    called_back = [i for i, run in enumerate(body.runs) if run.callback_url is not None]
    if called_back:
        _callbacks_allowed(ctx, f" (runs {', '.join(map(str, called_back))})")
    news = [_new_run(run, who) for run in body.runs]

    def work(isolate: bool) -> Callable[[Connection], list[submit_ops.Answer]]:
        return lambda conn: submit_ops.submit_runs(
            conn,
            ctx.registry,
            news,
            actor=who.name,
            namespace=ctx.namespace,
            limits=ctx.limits,
            backlog=ctx.backlog,
            isolate=isolate,
        )

    try:
        done = ctx.transaction(work(isolate=False))
    except InvalidInputError:
        # The database refused one's data: each in a savepoint of its own, to find it.
        done = ctx.transaction(work(isolate=True))
    items = [_batch_item(i, answer, news[i].workflow) for i, answer in enumerate(done)]
    over = [a for a in done if isinstance(a, BacklogFullError)]
    for answer in over:
        ctx.hooks.submissions_refused(answer.workflow, "api", 1)
    if over:
        response.headers["Retry-After"] = str(max(a.retry_after for a in over))
    statuses = [item["status"] for item in items]
    return {
        "runs": items,
        "created": statuses.count("created"),
        "duplicates": statuses.count("duplicate"),
        "refused": statuses.count("refused"),
    }


def _batch_item(index: int, answer: submit_ops.Answer, workflow: str) -> dict[str, Any]:
    if isinstance(answer, SubmitResult):
        return {
            "index": index,
            "status": "created" if answer.created else "duplicate",
            "id": answer.run_id,
            "key": answer.business_key,
            "input_differs": answer.input_differs,
            "message": answer.conflict(workflow),
        }
    if isinstance(answer, BacklogFullError):
        code, retry_after = "backlog_full", answer.retry_after
    elif isinstance(answer, Refused) and isinstance(answer.error, UnknownWorkflowError):
        code, retry_after = "unknown_workflow", None
    else:
        code, retry_after = "invalid_input", None
    message = str(answer) if isinstance(answer, BacklogFullError) else answer.reason
    return {
        "index": index,
        "status": "refused",
        "error": code,
        "message": message,
        "retry_after": retry_after,
    }


@router.get(
    "/{run_id}", response_model=responses.RunDetailResponse, responses=answers("run_not_found")
)
def get_run(
    run_id: RowId,
    ctx: Context,
    _: Annotated[Principal, Depends(require("read"))],
    map_items: MapItemsShown = DEFAULT_SHOWN,
) -> dict[str, Any]:
    """The run, its steps (a map's items grouped under it) and its last 50 events (oldest
    first)."""
    detail: dict[str, Any] = ctx.transaction(
        lambda conn: run_ops.show_run(conn, run_id, map_items=map_items)
    )
    detail["events"] = detail["events"][-LAST_EVENTS:]
    return detail


@router.get(
    "",
    response_model=responses.RunListResponse,
    responses={
        200: {
            "links": {
                "get_run": link("get_run", "The first run", run_id="$response.body#/runs/0/id")
            }
        },
        **answers(),
    },
)
def list_runs(
    *,
    ctx: Context,
    _: Annotated[Principal, Depends(require("read"))],
    state: Annotated[list[RunState] | None, Query()] = None,
    workflow: str | None = None,
    key: str | None = None,
    text: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            description="Text found (case-insensitive) in the business key, the run's input, "
            "output or error, or a step's error; among the newest 100,000 runs only.",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    cursor: Cursor = None,
    parked: Annotated[bool, Query(description="Only runs with a parked step.")] = False,
) -> dict[str, Any]:
    """Runs, newest first, one page at a time: follow `next_cursor` until it is null."""
    where = RunFilter(
        states=tuple(state or ()), workflow=workflow, key=key, text=text, limit=limit, parked=parked
    )
    page, next_cursor = ctx.transaction(lambda conn: run_ops.runs_page(conn, where, cursor=cursor))
    return {"runs": page, "next_cursor": next_cursor}


@router.post(
    "/{run_id}/cancel",
    response_model=responses.CancelledResponse,
    responses=answers("run_not_found", "invalid_action", body=True),
)
def cancel_run(
    run_id: RowId,
    body: Annotated[CancelRequest, Body(openapi_examples=CANCEL_EXAMPLES)],
    ctx: Context,
    who: Annotated[Principal, Depends(require("operate"))],
) -> dict[str, Any]:
    """Cancel a pending or running run (audited with the token's name); 409 otherwise."""
    done = ctx.transaction(
        lambda conn: cancel_ops.cancel(
            conn,
            run_id,
            actor=who.name,
            reason=body.reason,
            namespace=ctx.namespace,
            compensate=body.compensate,
        )
    )
    return {"id": done.run_id, "state": done.state, "cancelled_steps": list(done.cancelled_steps)}


@router.post(
    "/{run_id}/resubmit",
    response_model=responses.ResubmittedResponse,
    responses=answers(
        "invalid_input", "run_not_found", "unknown_workflow", "invalid_action", body=True
    ),
)
def resubmit_run(
    run_id: RowId,
    body: Annotated[ResubmitRequest, Body(openapi_examples=RESUBMIT_EXAMPLES)],
    ctx: Context,
    who: Annotated[Principal, Depends(require("operate"))],
) -> dict[str, Any]:
    """Run a failed, cancelled or compensated run again (optionally from a step, with a
    corrected input); 409 when its state does not allow it."""
    done = ctx.transaction(
        lambda conn: resubmit_ops.resubmit(
            conn,
            ctx.registry,
            run_id,
            actor=who.name,
            reason=body.reason,
            namespace=ctx.namespace,
            from_step=body.from_step,
            new_input=body.input,
        )
    )
    return {
        "id": done.run_id,
        "reset_steps": list(done.reset_steps),
        "ready_steps": list(done.ready_steps),
    }
