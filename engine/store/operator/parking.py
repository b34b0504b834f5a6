"""The operators' transitions of parked steps (ops/park.py): unpark them (pending again with a
fresh failure budget) or fail them (error: the run's failure policy follows)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import Connection, update

from sasflow.states import StepState
from sasflow.store.schema import steps
from sasflow.store.sqltime import now


def unpark_steps(conn: Connection, step_ids: Collection[int]) -> Sequence[Any]:
    """The parked steps `step_ids` (locked) become pending now with a fresh failure budget
    (failure_count 0, no deferral, no wait expiries); their attempt stays (the next claim takes
    the next one, so a late reply of an earlier attempt is still fenced out) and so does their
    last error, until an attempt succeeds; the rows changed (primary key)."""
    if not step_ids:
        return []
    return conn.execute(
        update(steps)
        .where(steps.c.id.in_(sorted(step_ids)), steps.c.state == StepState.PARKED)
        .values(
            state=StepState.PENDING,
            failure_count=0,
            wait_expiries=0,
            deferred_since=None,
            locked_by=None,
            not_before=now(),
            updated_at=now(),
        )
        .returning(steps.c.id, steps.c.run_id, steps.c.name, steps.c.attempt)
    ).all()


def fail_steps(conn: Connection, step_ids: Collection[int]) -> Sequence[Any]:
    """The parked steps `step_ids` (locked) go to error with the error they parked with; the
    rows changed (primary key)."""
    if not step_ids:
        return []
    return conn.execute(
        update(steps)
        .where(steps.c.id.in_(sorted(step_ids)), steps.c.state == StepState.PARKED)
        .values(state=StepState.ERROR, updated_at=now())
        .returning(steps.c.id, steps.c.run_id, steps.c.name, steps.c.attempt)
    ).all()
