"""A workflow's backlog: its runs submitted but not started yet (`runs.state = 'pending'`).

The doors (the HTTP API, the submitter, `submit_run`) read it before they admit a submission
(sasflow.backpressure); the supervisor's gauge counts it per workflow. Every statement here is
served by the partial index `ix_runs_backlog` (workflow, created_at) WHERE state = 'pending':
a run enters it at submission and leaves it when its first step is claimed, so the index holds
only the backlog, and counting one workflow's backlog never reads another's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Select, bindparam, func, select

from sasflow.states import RunState
from sasflow.store.schema import runs
from sasflow.store.sqltime import now


@dataclass(frozen=True)
class Backlog:
    """A workflow's backlog as one read saw it."""

    count: int
    """Runs waiting to start, counted up to the cap asked for (so at least this many)."""
    oldest: datetime | None
    """When the oldest of them was submitted (database clock); None when there is none."""
    db_now: datetime
    """The database's time of the read."""

    @property
    def oldest_age_s(self) -> float:
        """Seconds the oldest waiting run has waited (0 when none waits)."""
        if self.oldest is None:
            return 0.0
        return max(0.0, (self.db_now - self.oldest).total_seconds())


@cache
def _capped_backlog() -> Select[Any]:
    """The first :b_cap pending runs of :b_workflow in submission order, counted, with the
    oldest's time (ix_runs_backlog: a range scan that stops at the cap)."""
    waiting = (
        select(runs.c.created_at)
        .where(runs.c.workflow == bindparam("b_workflow"), runs.c.state == RunState.PENDING)
        .order_by(runs.c.created_at)
        .limit(bindparam("b_cap"))
        .subquery("waiting")
    )
    return select(
        func.count().label("n"),
        func.min(waiting.c.created_at).label("oldest"),
        now().label("db_now"),
    ).select_from(waiting)


def read_backlog(conn: Connection, workflow: str, *, cap: int) -> Backlog:
    """`workflow`'s backlog, counted up to `cap` runs (the count costs at most `cap` index
    entries, whatever the real backlog)."""
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    row = conn.execute(_capped_backlog(), {"b_workflow": workflow, "b_cap": cap}).one()
    return Backlog(count=int(row.n), oldest=row.oldest, db_now=row.db_now)


@cache
def _backlog_by_workflow() -> Select[Any]:
    """Pending runs per workflow (ix_runs_backlog: the whole backlog, no other run)."""
    return (
        select(runs.c.workflow, func.count().label("n"))
        .where(runs.c.state == RunState.PENDING)
        .group_by(runs.c.workflow)
    )


def backlog_by_workflow(conn: Connection) -> dict[str, int]:
    """Every workflow with runs waiting to start -> how many (the supervisor's gauge)."""
    return {str(r.workflow): int(r.n) for r in conn.execute(_backlog_by_workflow())}


@cache
def _existing_keys() -> Select[Any]:
    """The given business keys of :b_workflow that have a run (uq_runs_workflow_business_key)."""
    return select(runs.c.business_key).where(
        runs.c.workflow == bindparam("b_workflow"),
        runs.c.business_key.in_(bindparam("b_keys", expanding=True)),
    )


def existing_keys(conn: Connection, workflow: str, keys: Iterable[str]) -> set[str]:
    """Which of `keys` already name a run of `workflow`: submitting them again is an idempotent
    answer, never a new run, so no bound refuses them."""
    wanted = sorted(set(keys))
    if not wanted:
        return set()
    found = conn.execute(_existing_keys(), {"b_workflow": workflow, "b_keys": wanted}).scalars()
    return {str(k) for k in found}
