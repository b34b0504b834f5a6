"""Counts of work by state for the supervisor's metrics: cheap reads served by indexes."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, func, select

from sasflow.states import ACTIVE_RUN_STATES, RunState, StepState
from sasflow.store.runs.backlog import backlog_by_workflow
from sasflow.store.schema import leases, runs, schedulers, steps
from sasflow.store.sqltime import now, plus_seconds

GAUGED_RUN_STATES = (*sorted(ACTIVE_RUN_STATES), RunState.COMPENSATING)
"""Runs still moving; finished runs grow without bound and are counted by their counter."""
GAUGED_STEP_STATES = (StepState.PENDING, StepState.PROCESSING)
"""The step states with a partial index (ix_steps_ready, ix_steps_expiry)."""


@dataclass(frozen=True)
class StateCounts:
    runs: dict[str, int] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    schedulers_alive: int = 0
    lease_remaining: float = float("nan")
    """Seconds until the supervisor lease expires (negative: expired; NaN: never taken)."""
    backlog: dict[str, int] = field(default_factory=dict)
    """Runs waiting to start, by workflow (store.runs.backlog)."""


def run_counts(conn: Connection) -> dict[str, int]:
    """Runs by not-finished state (ix_runs_state_created_at)."""
    rows = conn.execute(
        select(runs.c.state, func.count())
        .where(runs.c.state.in_(GAUGED_RUN_STATES))
        .group_by(runs.c.state)
    ).all()
    found = {str(state): int(count) for state, count in rows}
    return {str(state): found.get(str(state), 0) for state in GAUGED_RUN_STATES}


def step_count(conn: Connection, state: StepState) -> int:
    """Steps in `state` (pending: ix_steps_ready; processing: ix_steps_expiry)."""
    return int(
        conn.execute(select(func.count()).select_from(steps).where(steps.c.state == state)).scalar()
        or 0
    )


def schedulers_alive(conn: Connection, *, within: float) -> int:
    """Schedulers with a heartbeat in the last `within` seconds (a handful of rows, no index)."""
    return int(
        conn.execute(
            select(func.count())
            .select_from(schedulers)
            .where(schedulers.c.heartbeat_at > plus_seconds(now(), -within))
        ).scalar()
        or 0
    )


def lease_remaining(conn: Connection, name: str) -> float:
    """Seconds until lease `name` expires, by the database clock (leases primary key)."""
    row = conn.execute(
        select(leases.c.expires_at, now().label("db_now")).where(leases.c.name == name)
    ).first()
    if row is None:
        return float("nan")
    return float((row.expires_at - row.db_now).total_seconds())


def state_counts(conn: Connection, *, lease: str, alive_within: float) -> StateCounts:
    """Every gauge of the supervisor in one read-only transaction."""
    return StateCounts(
        runs=run_counts(conn),
        steps={str(s): step_count(conn, s) for s in GAUGED_STEP_STATES},
        schedulers_alive=schedulers_alive(conn, within=alive_within),
        lease_remaining=lease_remaining(conn, lease),
        backlog=backlog_by_workflow(conn),
    )
