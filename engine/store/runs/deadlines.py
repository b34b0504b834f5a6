"""Run deadlines in the store (docs/timeouts.md): the runs whose deadline passed, and the mark
that it fired (a deadline fires once, whatever it then does)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    Select,
    Update,
    bindparam,
    literal_column,
    select,
    update,
)

from sasflow.states import RunState
from sasflow.store.dialect import one_of
from sasflow.store.schema import runs
from sasflow.store.sqltime import now

DUE_STATES = (RunState.PENDING, RunState.RUNNING)
"""The runs a deadline still applies to (schema: ix_runs_deadline_due's predicate)."""


@cache
def past_deadline() -> Select[Any]:
    """Up to :b_batch runs whose deadline passed and has not fired, oldest deadline first,
    locked, skipping runs another transaction holds (ix_runs_deadline_due)."""
    return (
        select(
            runs.c.id,
            runs.c.workflow,
            runs.c.business_key,
            runs.c.state,
            runs.c.deadline_at,
            runs.c.on_deadline,
        )
        .where(
            runs.c.deadline_at < now(),
            runs.c.deadline_fired_at.is_(None),
            # Constants, not parameters: the planner proves the partial index's predicate
            # from them whatever plan it caches.
            runs.c.state.in_([literal_column(f"'{s.value}'") for s in DUE_STATES]),
        )
        .order_by(runs.c.deadline_at)
        .limit(bindparam("b_batch"))
        .with_for_update(skip_locked=True)
    )


@cache
def fire() -> Update:
    """Mark the runs' deadlines fired (primary key)."""
    return (
        update(runs)
        .where(one_of(runs.c.id, "b_run_ids"))
        .values(deadline_fired_at=now(), updated_at=now())
    )


def take_past_deadline(conn: Connection, *, batch: int) -> Sequence[Row[Any]]:
    """The runs (locked) whose deadline passed, `batch` at most (`past_deadline`)."""
    return conn.execute(past_deadline(), {"b_batch": batch}).all()


def mark_fired(conn: Connection, run_ids: Sequence[int]) -> None:
    if run_ids:
        conn.execute(fire(), {"b_run_ids": list(run_ids)})
