"""Record a run for the HTTP API (or any caller with a token name): checked like a message."""

from __future__ import annotations

from pydantic import ValidationError

from sasflow.commands import NewRun, SubmitResult
from sasflow.doors import BacklogGate, admit_one
from sasflow.errors import InvalidInputError, InvalidMessageError
from sasflow.messages import Limits, Submission, encode_within, problems_line
from sasflow.registry import Registry
from sasflow.store.db import Connection
from sasflow.store.runs.submit import submit


def submit_run(
    conn: Connection,
    registry: Registry,
    new: NewRun,
    *,
    actor: str,
    namespace: str,
    limits: Limits,
    backlog: BacklogGate | None = None,
) -> SubmitResult:
    """Record `new` in the caller's transaction, idempotently on (workflow, key); its size and
    nesting are checked as the submitter checks a message. `actor` goes into the run's first
    event. With `backlog`, a workflow at its bound raises BacklogFullError, unless the key
    names an existing run (docs/backpressure.md)."""
    try:
        encode_within(
            Submission(
                workflow=new.workflow,
                input=new.input,
                key=new.key,
                priority=new.priority,
                version=new.version,
            ),
            limits,
        )
    except ValidationError as exc:
        raise InvalidInputError(f"invalid submission: {problems_line(exc)}") from exc
    except InvalidMessageError as exc:
        raise InvalidInputError(f"invalid submission: {exc}") from exc
    if backlog is None:
        return submit(conn, registry, new, namespace=namespace, actor=actor)
    workflow = registry.workflow(new.workflow)  # the latest version's bound
    admit_one(conn, backlog.room(conn, workflow), new.key)
    result = submit(conn, registry, new, namespace=namespace, actor=actor)
    if result.created:
        backlog.admitted(workflow.name, 1)
    return result


def known_workflows(registry: Registry) -> list[str]:
    """The names an unknown workflow's error lists."""
    return sorted({w.name for w in registry.workflows})
