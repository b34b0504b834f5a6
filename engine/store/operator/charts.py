"""What the console's workflow pages draw: per workflow the runs finished in recent windows
and their failure rate, and one workflow's finished runs per time bucket (throughput, failure
rate, p50/p95 duration). All on the database clock; every statement reads finished runs
through ix_runs_finished_at (a range of finished_at), so a window costs the runs it holds."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, Integer, cast, func, select

from sasflow.states import RunState
from sasflow.store.dialect import capabilities
from sasflow.store.schema import runs
from sasflow.store.sqltime import now, plus_seconds, seconds_between

FAILED_RUN_STATES = (RunState.ERROR, RunState.COMPENSATED, RunState.COMPENSATION_FAILED)
"""Finished runs counted as failures: the workflow did not do its work (a cancelled run was an
operator's choice, a completed one succeeded)."""


@dataclass(frozen=True)
class Bucket:
    """The runs of one workflow that finished in one bucket of time."""

    start: datetime
    finished: int
    failed: int
    p50_s: float | None
    """Median duration (created to finished), seconds; None without a finished run."""
    p95_s: float | None

    @property
    def failure_rate(self) -> float | None:
        return self.failed / self.finished if self.finished else None


@dataclass(frozen=True)
class Series:
    """One workflow over a window: `buckets` of `bucket_s` seconds, oldest first, covering
    [start, now) of the database clock (the last bucket ends at `now`)."""

    workflow: str
    start: datetime
    now: datetime
    bucket_s: float
    buckets: tuple[Bucket, ...]


def _failed() -> ColumnElement[Any]:
    return func.count().filter(runs.c.state.in_(FAILED_RUN_STATES))


def workflow_totals(conn: Connection, *, hour_s: float, day_s: float) -> list[dict[str, Any]]:
    """Per workflow with runs finished in the last `day_s` seconds: how many finished in the
    last `hour_s` and `day_s`, and how many of the latter failed (ix_runs_finished_at)."""
    recent = runs.c.finished_at >= plus_seconds(now(), -hour_s)
    rows = conn.execute(
        select(
            runs.c.workflow,
            func.count().filter(recent).label("finished_hour"),
            func.count().label("finished_day"),
            _failed().label("failed_day"),
        )
        .where(runs.c.finished_at >= plus_seconds(now(), -day_s))
        .group_by(runs.c.workflow)
        .order_by(runs.c.workflow)
    )
    return [dict(r._mapping) for r in rows]


def workflow_series(conn: Connection, workflow: str, *, window_s: float, bucket_s: float) -> Series:
    """The workflow's runs that finished in the last `window_s` seconds, per bucket: one
    aggregate over ix_runs_finished_at (percentile_cont on PostgreSQL; elsewhere the durations
    are read and interpolated as percentile_cont does)."""
    count = max(1, math.ceil(window_s / bucket_s))
    start_at = plus_seconds(now(), -count * bucket_s)
    clock = conn.execute(select(now().label("now"), start_at.label("start"))).one()
    duration = seconds_between(runs.c.finished_at, runs.c.created_at)
    index = cast(func.floor(seconds_between(runs.c.finished_at, start_at) / bucket_s), Integer)
    window = (
        runs.c.workflow == workflow,
        runs.c.finished_at >= start_at,
        runs.c.finished_at < now(),  # committed since this transaction's now: the next look
    )
    if capabilities(conn).percentiles:
        rows = conn.execute(
            select(
                index.label("bucket"),
                func.count(),
                _failed(),
                func.percentile_cont(0.5).within_group(duration),
                func.percentile_cont(0.95).within_group(duration),
            )
            .where(*window)
            .group_by(index)
        ).all()
        found = {int(b): (int(n), int(f), p50, p95) for b, n, f, p50, p95 in rows}
    else:
        found = _interpolated(conn, index, duration, window)
    buckets = []
    for i in range(count):
        n, failed, p50, p95 = found.get(i, (0, 0, None, None))
        buckets.append(
            Bucket(
                start=_shift(clock.start, i * bucket_s),
                finished=n,
                failed=failed,
                p50_s=None if p50 is None else float(p50),
                p95_s=None if p95 is None else float(p95),
            )
        )
    return Series(workflow, _at(clock.start), _at(clock.now), bucket_s, tuple(buckets))


def _interpolated(
    conn: Connection,
    index: ColumnElement[Any],
    duration: ColumnElement[Any],
    window: tuple[ColumnElement[bool], ...],
) -> dict[int, tuple[int, int, float | None, float | None]]:
    """The portable twin: each finished run's bucket, state and duration, then the same
    figures in Python (SQLite has no percentile_cont)."""
    rows = conn.execute(select(index, runs.c.state, duration).where(*window))
    per: defaultdict[int, list[tuple[str, float]]] = defaultdict(list)
    for bucket, state, seconds in rows:
        per[int(bucket)].append((str(state), float(seconds)))
    return {
        b: (
            len(found),
            sum(1 for state, _ in found if state in FAILED_RUN_STATES),
            percentile_cont(sorted(s for _, s in found), 0.5),
            percentile_cont(sorted(s for _, s in found), 0.95),
        )
        for b, found in per.items()
    }


def percentile_cont(ordered: list[float], fraction: float) -> float | None:
    """PostgreSQL's percentile_cont: linear interpolation between the closest ranks."""
    if not ordered:
        return None
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _at(value: Any) -> datetime:
    """A timestamp the database returned (SQLite: its text) as a datetime."""
    found = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return found if found.tzinfo else found.replace(tzinfo=UTC)


def _shift(start: Any, seconds: float) -> datetime:
    return _at(start) + timedelta(seconds=seconds)
