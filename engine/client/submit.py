"""Submit runs from Python, inside the caller's own database transaction."""

from __future__ import annotations

from pydantic import ValidationError

from sasflow.commands import SubmitResult
from sasflow.errors import InvalidInputError, InvalidMessageError
from sasflow.messages import DEFAULT_LIMITS, Limits, Submission, encode_within
from sasflow.registry import Registry
from sasflow.store.db import Connection
from sasflow.store.runs.submit import submit
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
    limits: Limits = DEFAULT_LIMITS,
) -> SubmitResult:
    """Record a run of `workflow` on `conn`, in the caller's transaction.

    The run and its step records commit or roll back with the caller's own rows (the order row
    and its workflow are one fact). Idempotent on (workflow, key): submitting the same key again
    returns the existing run with `created=False`. Schedulers of `namespace` are woken at commit.
    `conn` may be `session.connection()` of an ORM Session. The input must be a JSON object,
    and the submission as a message within `limits` (what the submitter would accept).
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
        encode_within(submission, limits)
    except ValidationError as exc:
        raise InvalidInputError(f"invalid submission: {exc}") from exc
    except InvalidMessageError as exc:
        raise InvalidInputError(f"invalid submission: {exc}") from exc
    return submit(conn, registry, submission.new_run(), namespace=namespace, actor="python")
