"""Submit runs from Python, inside the caller's own database transaction."""

from __future__ import annotations

from pydantic import ValidationError

from sasflow.errors import InvalidInputError
from sasflow.messages import Submission
from sasflow.registry import Registry
from sasflow.store.commands import SubmitResult
from sasflow.store.db import Connection
from sasflow.store.submit import submit
from sasflow.workflow import JSON


def submit_run(
    conn: Connection,
    registry: Registry,
    workflow: str,
    input: JSON,  # noqa: A002 - the public name of the run's input
    *,
    key: str | None = None,
    priority: int = 0,
    version: int | None = None,
    reply_to: str | None = None,
    namespace: str,
) -> SubmitResult:
    """Record a run of `workflow` on `conn`, in the caller's transaction.

    The run and its step records commit or roll back with the caller's own rows (the order row
    and its workflow are one fact). Idempotent on (workflow, key): submitting the same key again
    returns the existing run with `created=False`. Schedulers of `namespace` are woken at commit.
    `conn` may be `session.connection()` of an ORM Session.
    """
    try:
        submission = Submission(
            workflow=workflow,
            input=input,
            key=key,
            priority=priority,
            version=version,
            reply_to=reply_to,
        )
    except ValidationError as exc:
        raise InvalidInputError(f"invalid submission: {exc}") from exc
    return submit(conn, registry, submission.new_run(), namespace=namespace, actor="python")
