"""Parked steps (docs/operations.md "Parked steps"): a step whose failures ran out, or that
answered a permanent error, and whose policy parks it (`steps.park_exhausted`,
`steps.park_errors`) goes `parked` instead of `error` (queries.failure_values,
queries.fail_step). No claim takes it, and its run keeps its state and waits: `decide` sees a
step neither done nor failed. This module raises the `step_parked` alert when steps park, in
the transaction that parked them, and says which steps of runs are parked; the operators'
unpark and fail are in `sasflow.ops.park` (they resolve the alert, as skipping a parked step
does when its run fails at another step).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import Connection, exists, select

from sasflow.states import StepState
from sasflow.store.outbox.alerts import STEP_PARKED, Alert, raise_alert, resolve_open
from sasflow.store.schema import runs, steps


def raise_parked_alerts(conn: Connection, step_ids: Collection[int], *, actor: str) -> list[int]:
    """Raise one `step_parked` alert per step of `step_ids` (steps that just parked), with its
    last error and failure count; the ids of the alerts raised (primary key)."""
    if not step_ids:
        return []
    rows = conn.execute(
        select(
            steps.c.id,
            steps.c.run_id,
            steps.c.name,
            steps.c.error,
            steps.c.failure_count,
            steps.c.max_failures,
            steps.c.attempt,
            runs.c.workflow,
            runs.c.business_key,
        )
        .join(runs, runs.c.id == steps.c.run_id)
        .where(steps.c.id.in_(sorted(step_ids)), steps.c.state == StepState.PARKED)
    ).all()
    raised = []
    for row in rows:
        alert_id = raise_alert(conn, parked_alert(row, actor=actor))
        if alert_id is not None:
            raised.append(alert_id)
    return raised


def parked_alert(row: Any, *, actor: str) -> Alert:
    """The `step_parked` alert of a parked step (a row of `raise_parked_alerts`)."""
    error = row.error if isinstance(row.error, dict) else {}
    described = f"{error.get('type', 'error')}: {error.get('message', '')}".rstrip(": ")
    why = (
        f"after {row.failure_count}/{row.max_failures} failures"
        if row.failure_count >= row.max_failures
        else "on a permanent error"
    )
    message = (
        f"run {row.run_id} of {row.workflow} (key {row.business_key}): step {row.name!r} is "
        f"parked {why} ({described}); unpark it once its partner is fixed, or fail it"
    )
    return Alert(
        STEP_PARKED,
        parked_subject(row.id),
        message,
        run_id=row.run_id,
        step_id=row.id,
        detail={
            "step": row.name,
            "error": row.error,
            "failure_count": row.failure_count,
            "attempt": row.attempt,
            "reported_by": actor,
        },
        workflow=row.workflow,
    )


def parked_subject(step_id: int) -> str:
    """The subject of a parked step's alert (with the kind, its deduplication key)."""
    return str(step_id)


def resolve_parked_alert(conn: Connection, step_id: int, *, actor: str, reason: str) -> bool:
    """Close the `step_parked` alert of step `step_id`, which is parked no more (unparked,
    failed, or skipped by its run's failure); False when none was open."""
    key = Alert(STEP_PARKED, parked_subject(step_id), "").dedup_key
    return resolve_open(conn, key, actor=actor, reason=reason)


def parked_steps(conn: Connection, run_id: int, *, lock: bool = False) -> Sequence[Any]:
    """The parked steps of run `run_id`: id, name, attempt, failure_count, error; locked
    (`lock`) against other operators until commit (ix_steps_parked)."""
    query = (
        select(
            steps.c.id,
            steps.c.run_id,
            steps.c.name,
            steps.c.kind,
            steps.c.state,
            steps.c.attempt,
            steps.c.failure_count,
            steps.c.error,
        )
        .where(steps.c.run_id == run_id, steps.c.state == StepState.PARKED)
        .order_by(steps.c.id)
    )
    return conn.execute(query.with_for_update() if lock else query).all()


def has_parked_step() -> Any:
    """A predicate on `runs`: the run has a parked step (ix_steps_parked)."""
    return exists().where(steps.c.run_id == runs.c.id, steps.c.state == StepState.PARKED)
