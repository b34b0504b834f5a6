"""REST tasks: submit, read, list, cancel and resubmit runs (the same ops as the CLI)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response

from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.errors import ApiError
from sasflow.api.models import RunRequest
from sasflow.errors import UnknownWorkflowError
from sasflow.ops import runs as run_ops
from sasflow.ops import submit as submit_ops
from sasflow.store.commands import NewRun
from sasflow.store.db import Connection

router = APIRouter(prefix="/v1/runs", tags=["runs"])

Context = Annotated[ApiContext, Depends(get_context)]


@router.post("", status_code=201, responses={200: {"description": "existing run (same key)"}})
def submit_run(
    body: RunRequest,
    response: Response,
    ctx: Context,
    who: Annotated[Principal, Depends(require("submit"))],
) -> dict[str, Any]:
    """Submit a run: 201 with `Location` and the run, or 200 with the run the key maps to."""
    if body.callback_url is not None and ctx.settings.api_callback_secret is None:
        raise ApiError(
            400,
            "callbacks_disabled",
            "this server has no callback key (SASFLOW_API_CALLBACK_SECRET): it cannot sign "
            "callbacks, so it refuses runs with a callback_url",
        )
    new = NewRun(
        workflow=body.workflow,
        input=body.input,
        key=body.key,
        priority=body.priority,
        version=body.version,
        submitted_by=who.name,
        callback_url=None if body.callback_url is None else str(body.callback_url),
        pool=body.pool,
    )

    def work(conn: Connection) -> tuple[bool, dict[str, Any]]:
        result = submit_ops.submit_run(
            conn, ctx.registry, new, actor=who.name, namespace=ctx.namespace, limits=ctx.limits
        )
        return result.created, run_ops.show_run(conn, result.run_id)["run"]

    try:
        created, run = ctx.transaction(work)
    except UnknownWorkflowError as exc:
        known = submit_ops.known_workflows(ctx.registry)
        raise ApiError(
            404,
            "unknown_workflow",
            f"{exc}; known workflows: {', '.join(known) or 'none'}",
            extra={"known": known},
        ) from exc
    if not created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/runs/{run['id']}"
    return {"id": run["id"], "created": created, "run": run}


@router.get("/{run_id}")
def get_run(
    run_id: int, ctx: Context, _: Annotated[Principal, Depends(require("read"))]
) -> dict[str, Any]:
    """The run, its steps and its last events."""
    detail: dict[str, Any] = ctx.transaction(lambda conn: run_ops.show_run(conn, run_id))
    return detail
