"""Submit runs from Python, inside the caller's own database transaction."""

from __future__ import annotations

from datetime import datetime

from pydantic import ValidationError

from sasflow.backpressure import DEFAULT_MAX_BACKLOG, ON_BACKLOG, OnBacklog
from sasflow.commands import SubmitResult
from sasflow.doors import admit_one, room_now
from sasflow.errors import ConfigurationError, InvalidInputError, InvalidMessageError
from sasflow.messages import DEFAULT_LIMITS, Limits, Submission, encode_within, problems_line
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
    on_backlog: OnBacklog = "accept",
    max_backlog: int = DEFAULT_MAX_BACKLOG,
    start_at: datetime | None = None,
) -> SubmitResult:
    """Record a run of `workflow` on `conn`, in the caller's transaction.

    The run and its step records commit or roll back with the caller's own rows (the order row
    and its workflow are one fact). Idempotent on (workflow, key): submitting the same key again
    returns the existing run with `created=False`. Schedulers of `namespace` are woken at commit.
    `conn` may be `session.connection()` of an ORM Session. The input must be a JSON object,
    and the submission as a message within `limits` (what the submitter would accept).

    Backpressure (docs/backpressure.md): with `on_backlog="reject"`, a workflow that has as
    many runs waiting to start as its bound (the `max_backlog` of its latest version, else
    `max_backlog`; 0: no bound) raises BacklogFullError, unless `key` names an existing
    run. The default, "accept", records the run whatever the backlog. There is no "block"
    here: waiting would hold the caller's transaction open; call `wait_for_room` before
    opening it.

    `start_at` (timezone-aware): the run's first steps are not claimed before it, on the
    database clock (docs/concepts.md, "Runs that start later"); None or a past time: at once.
    """
    if on_backlog not in ON_BACKLOG:
        hint = (
            ": waiting inside your transaction would hold it open; call "
            "sasflow.wait_for_room(engine, ...) before opening it, then submit with "
            "on_backlog='reject'"
            if str(on_backlog) == "block"
            else ""
        )
        raise ConfigurationError(
            f"on_backlog must be one of {', '.join(ON_BACKLOG)}, not {on_backlog!r}{hint}"
        )
    if isinstance(max_backlog, bool) or not isinstance(max_backlog, int) or max_backlog < 0:
        raise ConfigurationError(f"max_backlog must be an integer >= 0, not {max_backlog!r}")
    try:
        submission = Submission(
            workflow=workflow,
            input=input,
            key=key,
            priority=priority,
            version=version,
            reply_to=reply_to,
            start_at=start_at,
        )
        encode_within(submission, limits)
    except ValidationError as exc:
        raise InvalidInputError(f"invalid submission: {problems_line(exc)}") from exc
    except InvalidMessageError as exc:
        raise InvalidInputError(f"invalid submission: {exc}") from exc
    if on_backlog == "reject":
        definition = registry.workflow(workflow)  # the latest version's bound
        admit_one(conn, room_now(conn, definition, max_backlog), key)
    return submit(conn, registry, submission.new_run(), namespace=namespace, actor="python")
