"""Record runs: the one door (`record_runs`) that `submit_run`, the submitter and schedule
firing take, and the portable path.

A run and its step records are inserted in the caller's transaction, idempotently on
(workflow, key). Where the engine's capabilities allow it, runs take one statement
(submit_many); the others, and every run on SQLite, take the portable path here
(`insert_portable`): a few statements per run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Executable, bindparam, case, insert, select, update
from sqlalchemy.exc import DBAPIError

from sasflow.commands import NewRun, Refused, SubmitResult
from sasflow.errors import InvalidInputError, InvalidMessageError, UnknownWorkflowError
from sasflow.messages import dumps
from sasflow.registry import Registry
from sasflow.states import RunState, StepState
from sasflow.store.db import is_message_fault
from sasflow.store.dialect import upsert_insert
from sasflow.store.notify import notify_ready
from sasflow.store.runs import events, submit_many
from sasflow.store.runs.step_rows import forward_definition, step_row
from sasflow.store.schema import runs, steps
from sasflow.store.sqltime import now, plus_seconds
from sasflow.store.types import Timestamp
from sasflow.workflow import StepContext, Workflow

log = logging.getLogger(__name__)


def record_runs(
    conn: Connection,
    registry: Registry,
    submissions: Sequence[NewRun],
    *,
    namespace: str,
    actor: str,
    notify: bool = True,
    isolate: bool = False,
) -> list[SubmitResult | Refused]:
    """Record `submissions` in the caller's transaction on `conn`: one answer per submission,
    in order. A submission whose workflow is unknown or whose input is not JSON is `Refused`
    before the database sees it. The others are recorded:

    - together (`isolate` False): the runs of workflows `submit_many.one_statement` accepts
      in one statement, then the others on the portable path, one at a time, no savepoints.
      When the database refuses the data of one (`db.is_message_fault`), or a first step's
      input cannot be built, InvalidInputError is raised and the caller's transaction can only
      be rolled back: record the submissions again with `isolate` to find which one it was.
    - each in a savepoint of its own (`isolate`): one that cannot be recorded is `Refused`,
      without undoing the others.

    With `notify`, listening schedulers are woken at commit when a run was created; without
    it the caller wakes them itself (once for a batch). Any other database error is raised as
    is (the database cannot take it now, or a bug), never blamed on a submission.
    """
    answers: list[SubmitResult | Refused | None] = []
    # (the answer's index, the run, whether it takes the one statement)
    entries: list[tuple[int, submit_many.Prepared, bool]] = []
    for new in submissions:
        try:
            prepared = submit_many.prepare(registry, new)
        except (UnknownWorkflowError, InvalidInputError) as exc:
            answers.append(Refused(exc))
            continue
        entries.append((len(answers), prepared, submit_many.one_statement(conn, prepared.workflow)))
        answers.append(None)
    # Every path records in (workflow, key) order, whatever the submissions' order: two
    # transactions with keys in common then lock them in the same order (no deadlock). The
    # one statement sorts by itself (and draws the run ids in the submissions' order).
    by_key = sorted(entries, key=lambda e: (e[1].workflow.name, e[1].key))
    woken = False
    if isolate:
        for i, prepared, one_statement in by_key:
            try:
                with conn.begin_nested():
                    answers[i] = _record_one(
                        conn,
                        prepared,
                        one_statement=one_statement,
                        actor=actor,
                        namespace=namespace,
                    )
            except InvalidInputError as exc:
                answers[i] = Refused(exc)
    else:
        fast = [(i, prepared) for i, prepared, one_statement in entries if one_statement]
        if fast:
            done = submit_many.insert(
                conn, [p for _, p in fast], actor=actor, namespace=namespace, notify=notify
            )
            for (i, _), result in zip(fast, done, strict=True):
                answers[i] = result
                woken = woken or result.created
        for i, prepared, one_statement in by_key:
            if not one_statement:
                answers[i] = insert_portable(conn, prepared, actor=actor)
    _delay_starts(conn, entries, answers)
    recorded = [a for a in answers if a is not None]
    if len(recorded) != len(answers):
        raise RuntimeError("record_runs left a submission unanswered")
    if notify and not woken and any(isinstance(a, SubmitResult) and a.created for a in recorded):
        notify_ready(conn, namespace)
    return recorded


def _delay_starts(
    conn: Connection,
    entries: Sequence[tuple[int, submit_many.Prepared, bool]],
    answers: Sequence[SubmitResult | Refused | None],
) -> None:
    """The first steps of the runs just created with a `start_at` wait for it."""
    delayed = [
        {"b_run_id": answer.run_id, "b_start_at": prepared.new.start_at}
        for i, prepared, _ in entries
        if prepared.new.start_at is not None
        and isinstance(answer := answers[i], SubmitResult)
        and answer.created
    ]
    if delayed:
        conn.execute(_DELAY_START, delayed)


def _record_one(
    conn: Connection,
    prepared: submit_many.Prepared,
    *,
    one_statement: bool,
    actor: str,
    namespace: str,
) -> SubmitResult:
    """One run on its path, the schedulers not woken."""
    if one_statement:
        [result] = submit_many.insert(
            conn, [prepared], actor=actor, namespace=namespace, notify=False
        )
        return result
    return insert_portable(conn, prepared, actor=actor)


def submit(
    conn: Connection,
    registry: Registry,
    submission: NewRun,
    *,
    namespace: str,
    actor: str,
    notify: bool = True,
) -> SubmitResult:
    """Record one run inside the caller's transaction on `conn` (commit or roll back with it):
    `record_runs` for one submission. With `notify` False the caller wakes the schedulers
    itself (once for a batch).

    Raises UnknownWorkflowError for an unregistered workflow, and InvalidInputError when the
    input is not JSON, a first step's input cannot be built, or the database refuses the data
    the submission carries (`db.is_message_fault`); any other database error is raised as is.
    """
    [answer] = record_runs(
        conn, registry, [submission], namespace=namespace, actor=actor, notify=notify
    )
    if isinstance(answer, Refused):
        raise answer.error
    return answer


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


_SET_DEADLINE = (
    update(runs)
    .where(runs.c.id == bindparam("b_run_id"))
    .values(
        deadline_at=plus_seconds(now(), bindparam("b_deadline_s")),
        on_deadline=bindparam("b_on_deadline"),
    )
)
"""A new run's deadline, on the database clock (primary key); runs without one skip it."""

_START_AT = bindparam("b_start_at", type_=Timestamp())
_DELAY_START = (
    update(steps)
    .where(steps.c.run_id == bindparam("b_run_id"), steps.c.state == StepState.PENDING)
    .values(not_before=case((now() < _START_AT, _START_AT), else_=now()))
)
"""A new run submitted with `start_at`: its first steps (the pending ones) are not claimed
before it; a past time is now, so it does not jump the claim's queue (uq_steps_run_id_kind_name)."""

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


def insert_portable(
    conn: Connection, prepared: submit_many.Prepared, *, actor: str
) -> SubmitResult:
    """One run in a few statements, any database and any workflow (no NOTIFY). Raises
    InvalidInputError when a first step's input cannot be built or the database refuses the
    data (`db.is_message_fault`): the caller's transaction must then be rolled back (or its
    savepoint)."""
    try:
        return _insert_portable(conn, prepared, actor=actor)
    except DBAPIError as exc:
        if is_message_fault(exc):
            raise InvalidInputError(f"database rejected the submission: {exc.orig}") from exc
        raise


def _insert_portable(
    conn: Connection, prepared: submit_many.Prepared, *, actor: str
) -> SubmitResult:
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
        differs = existing.input != submission.input
        if differs:
            log.warning(
                "duplicate submission of %s key %r with a different input: run %s kept as is",
                workflow.name,
                key,
                existing.id,
            )
        return SubmitResult(
            existing.id, key, created=False, state=existing.state, input_differs=differs
        )

    if workflow.deadline is not None:
        conn.execute(
            _SET_DEADLINE,
            {
                "b_run_id": run_id,
                "b_deadline_s": workflow.deadline,
                "b_on_deadline": workflow.on_deadline.value,
            },
        )
    ctx = StepContext(run_input=submission.input, outputs={}, run_id=run_id, business_key=key)
    rows: list[dict[str, Any]] = []
    for name in workflow.order:
        root = not workflow.dependencies[name]
        rows.append(
            step_row(
                forward_definition(workflow, name),
                run_id=run_id,
                priority=submission.priority,
                input=build_step_input(workflow, name, ctx) if root else None,
                pool=workflow.step(name).pool or submission.pool,
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
