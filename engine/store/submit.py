"""Insert a run and its step records in one transaction, idempotently on (workflow, key).

On PostgreSQL most runs take one statement (submit_many); this module's generic path serves
SQLite and the workflows whose first step builds its own input in Python."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Connection, Executable, insert, select
from sqlalchemy.exc import DBAPIError

from sasflow.errors import InvalidInputError, InvalidMessageError
from sasflow.messages import dumps
from sasflow.registry import Registry
from sasflow.states import RunState, StepKind
from sasflow.store import events, submit_many
from sasflow.store.commands import NewRun, SubmitResult
from sasflow.store.db import is_message_fault
from sasflow.store.dialect import upsert_insert
from sasflow.store.notify import notify_ready
from sasflow.store.schema import runs, steps
from sasflow.store.step_rows import policy_columns, step_row
from sasflow.workflow import StepContext, Workflow

log = logging.getLogger(__name__)


def build_step_input(workflow: Workflow, step_name: str, ctx: StepContext) -> Any:
    """Run the step's input builder and check that its result is JSON."""
    try:
        value = workflow.step(step_name).input(ctx)
        dumps(value)
    except InvalidMessageError as exc:
        raise InvalidInputError(f"step {step_name!r}: input is not JSON: {exc}") from exc
    except Exception as exc:  # the builder is user code: any failure is reported, not raised
        raise InvalidInputError(
            f"step {step_name!r}: input builder raised {type(exc).__name__}: {exc}"
        ) from exc
    return value


def submit(
    conn: Connection,
    registry: Registry,
    submission: NewRun,
    *,
    namespace: str,
    actor: str,
    notify: bool = True,
) -> SubmitResult:
    """Record a run inside the caller's transaction on `conn` (commit or roll back with it).
    With `notify` False the caller wakes the schedulers itself (once for a batch).

    Raises UnknownWorkflowError for an unregistered workflow, and InvalidInputError when the
    input is not JSON, a first step's input cannot be built, or the database refuses the data
    the submission carries (`db.is_message_fault`); any other database error is raised as is
    (the database cannot take it now, or a bug), never blamed on the submission.
    """
    prepared = submit_many.prepare(registry, submission)
    try:
        if submit_many.one_statement(conn, prepared.workflow):
            [result] = submit_many.insert(
                conn, [prepared], actor=actor, namespace=namespace, notify=notify
            )
            return result
        result = insert_generic(conn, prepared, actor=actor)
    except DBAPIError as exc:
        if is_message_fault(exc):
            raise InvalidInputError(f"database rejected the submission: {exc.orig}") from exc
        raise
    if result.created and notify:
        notify_ready(conn, namespace)
    return result


_RUN_INSERTS: dict[str, Executable] = {}
_STEPS_INSERT = insert(steps)
"""Statements built once (per dialect for the upsert): SQLAlchemy then finds their compiled
form in its cache without building a new construct per run."""


def _run_insert(conn: Connection) -> Executable:
    """INSERT INTO runs ... ON CONFLICT (workflow, business_key) DO NOTHING RETURNING id."""
    statement = _RUN_INSERTS.get(conn.dialect.name)
    if statement is None:
        statement = (
            upsert_insert(conn, runs)
            .on_conflict_do_nothing(index_elements=[runs.c.workflow, runs.c.business_key])
            .returning(runs.c.id)
        )
        _RUN_INSERTS[conn.dialect.name] = statement
    return statement


def insert_generic(conn: Connection, prepared: submit_many.Prepared, *, actor: str) -> SubmitResult:
    """One run in a few statements, any database and any workflow (no NOTIFY)."""
    workflow, submission, key = prepared.workflow, prepared.new, prepared.key
    run_id = conn.execute(
        _run_insert(conn),
        {
            "workflow": workflow.name,
            "version": workflow.version,
            "business_key": key,
            "input": submission.input,
            "priority": submission.priority,
            "state": RunState.PENDING,
            "reply_to": submission.reply_to,
            "submitted_by": submission.submitted_by,
            "callback_url": submission.callback_url,
            "pool": submission.pool,
            "trace_parent": submission.trace_parent,
            "on_failure": workflow.on_failure,
        },
    ).scalar_one_or_none()
    if run_id is None:
        existing = conn.execute(
            select(runs.c.id, runs.c.state, runs.c.input).where(
                runs.c.workflow == workflow.name, runs.c.business_key == key
            )
        ).one()
        if existing.input != submission.input:
            log.warning(
                "duplicate submission of %s key %r with a different input: run %s kept as is",
                workflow.name,
                key,
                existing.id,
            )
        return SubmitResult(existing.id, key, created=False, state=existing.state)

    ctx = StepContext(run_input=submission.input, outputs={}, run_id=run_id, business_key=key)
    rows: list[dict[str, Any]] = []
    for name in workflow.order:
        step = workflow.step(name)
        deps = workflow.dependencies[name]
        rows.append(
            step_row(
                run_id=run_id,
                name=name,
                kind=StepKind.FORWARD,
                agent=step.agent,
                action=step.action,
                depends_on=deps,
                priority=submission.priority,
                input=None if deps else build_step_input(workflow, name, ctx),
                policy=policy_columns(step.policy),
                compensate_action=step.compensate,
                pool=step.pool or submission.pool,
            )
        )
    conn.execute(_STEPS_INSERT, rows)
    events.record(
        conn,
        [
            events.Event(
                run_id=run_id,
                entity="run",
                to_state=RunState.PENDING,
                actor=actor,
                reason="received",
                detail={"priority": submission.priority},
            )
        ],
    )
    return SubmitResult(run_id, key, created=True, state=RunState.PENDING)
