"""Fire the due ticks of the schedules one scheduler holds, fenced by its registration.

One transaction locks the holder's due schedules (only while its lease is live: a scheduler
that lost its lease fires nothing), submits a run per tick (business key
`schedule:<id>:<tick>`, so a tick fired twice makes one run), records the ticks and moves each
schedule to its next tick. A draining scheduler releases each schedule in the transaction that
submits its due tick (so the next holder starts from the following tick), a few per
transaction, so that an operator can stop a drain half-way.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sasflow.commands import NewRun, Refused
from sasflow.registry import Registry
from sasflow.schedules.timing import CatchUp, Timing, tick_key, ticks_to_fire
from sasflow.store.cluster import schedules
from sasflow.store.cluster.shard import Bounds
from sasflow.store.db import Connection
from sasflow.store.notify import notify_ready
from sasflow.store.runs.submit import record_runs

log = logging.getLogger(__name__)


@dataclass
class FireReport:
    schedules: int = 0
    """Schedules locked (due ones; every held one when draining)."""
    fired: int = 0
    """Ticks submitted."""
    released: int = 0
    more: bool = False
    """Work was left for another transaction (the batch or the tick budget was full)."""
    late: list[float] = field(default_factory=list)
    """Seconds between each fired tick's time and the database time it was fired at."""


def timing_of(schedule: Any) -> Timing:
    """A stored schedule's timing (its columns, by name)."""
    interval = schedule["interval_s"]
    return Timing(
        cron=schedule["cron"],
        interval_s=None if interval is None else int(interval),
        timezone=schedule["timezone"],
    )


def fire_due(
    conn: Connection,
    registry: Registry,
    *,
    holder: str,
    fired_by: str,
    namespace: str,
    drain_horizon: float | None = None,
    limit: int = 100,
    tick_budget: int = 200,
    isolate: bool = True,
    bounds: Bounds | None = None,
) -> FireReport:
    """Inside the caller's transaction: fire what is due of up to `limit` schedules `holder`
    holds, at most `tick_budget` ticks (a schedule far behind fires its oldest ticks first and
    the rest in the next transactions: a transaction stays short, whatever the backlog).
    `isolate`: each tick in a savepoint (see submit_ticks). `bounds`: only the schedules whose
    id is within them (the scope strategy's range, checked by the caller's fence).

    Draining (`drain_horizon` given): release each schedule right after its due tick was
    submitted, and at once those whose next tick is more than `drain_horizon` seconds away;
    the others stay held until their tick.
    """
    report = FireReport()
    moves: list[schedules.Ticked] = []
    fired: list[dict[str, Any]] = []
    batch: list[tuple[Target, dt.datetime]] = []  # fired[i]'s tick, submitted after the loop
    draining = drain_horizon is not None
    rows, db_now = schedules.lock_owned(
        conn, holder, due_only=not draining, limit=limit, bounds=bounds
    )
    report.more = len(rows) == limit
    budget = tick_budget
    for row in rows:
        if db_now is None or budget <= 0:
            report.more = True
            break
        report.schedules += 1
        due = row.next_tick_at <= db_now
        release = draining and (
            due or (row.next_tick_at - db_now).total_seconds() > (drain_horizon or 0.0)
        )
        if not due and not release:
            continue
        next_tick_at = row.next_tick_at
        ticks: list[dt.datetime] = []
        if due:
            timing = timing_of(row._mapping)
            ticks = ticks_to_fire(
                timing,
                since=row.next_tick_at,
                now=db_now,
                acquired_at=row.acquired_at or db_now,
                catch_up=CatchUp(row.catch_up),
                max_catch_up=row.max_catch_up,
            )
            behind = len(ticks) > budget
            report.more = report.more or behind
            ticks = ticks[:budget]
            budget -= len(ticks)
            target = Target.of(row._mapping)
            for tick in ticks:
                batch.append((target, tick))
                fired.append(tick_row(row.id, tick, None, fired_by, None))
                report.late.append((db_now - tick).total_seconds())
            next_tick_at = timing.next_after(ticks[-1] if behind else db_now)
            release = release and not behind
        report.fired += len(ticks)
        report.released += int(release)
        moves.append(
            schedules.Ticked(row.id, next_tick_at, ticks[-1] if ticks else None, release=release)
        )
    submitted = submit_ticks(
        conn, registry, batch, fired_by=fired_by, namespace=namespace, isolate=isolate
    )
    for record, (run_id, error) in zip(fired, submitted, strict=True):
        record["run_id"], record["error"] = run_id, error
    schedules.record_ticks(conn, fired)
    schedules.set_ticked(conn, moves)
    if report.fired:
        notify_ready(conn, namespace)
    return report


@dataclass(frozen=True)
class Target:
    """What a tick submits: the schedule's id and name, its workflow and input."""

    id: int
    name: str
    workflow: str
    input: Any

    @classmethod
    def of(cls, schedule: Any) -> Target:
        """From a schedule's columns (by name)."""
        return cls(schedule["id"], schedule["name"], schedule["workflow"], schedule["input"])


def submit_ticks(
    conn: Connection,
    registry: Registry,
    ticks: Sequence[tuple[Target, dt.datetime]],
    *,
    fired_by: str,
    namespace: str,
    isolate: bool,
) -> list[tuple[int | None, str | None]]:
    """Submit the runs of ticks (schedules.submit.record_runs; the caller wakes the schedulers):
    for each its run id, or None and why its run cannot be made (unknown workflow, bad input:
    the caller records the tick with the error, never retried). Without `isolate` the runs go
    in together, without savepoints, and data the database refuses raises InvalidInputError:
    the caller rolls back and fires the batch again with `isolate` (a savepoint per tick)."""
    answers = record_runs(
        conn,
        registry,
        [NewRun(workflow=t.workflow, input=t.input, key=tick_key(t.id, tick)) for t, tick in ticks],
        namespace=namespace,
        actor=fired_by,
        notify=False,
        isolate=isolate,
    )
    submitted: list[tuple[int | None, str | None]] = []
    for (schedule, tick), answer in zip(ticks, answers, strict=True):
        if isinstance(answer, Refused):
            log.error(
                "schedule %s (%s): tick %s not submitted: %s",
                schedule.id,
                schedule.name,
                tick,
                answer.reason,
            )
            submitted.append((None, answer.reason))
        else:
            submitted.append((answer.run_id, None))
    return submitted


def submit_tick(
    conn: Connection,
    registry: Registry,
    schedule: Target,
    tick: dt.datetime,
    *,
    fired_by: str,
    namespace: str,
) -> tuple[int | None, str | None]:
    """Submit the run of one tick in a savepoint (`submit_ticks`): its run id, or None and why
    its run cannot be made."""
    [submitted] = submit_ticks(
        conn, registry, [(schedule, tick)], fired_by=fired_by, namespace=namespace, isolate=True
    )
    return submitted


def tick_row(
    schedule_id: int, tick: dt.datetime, run_id: int | None, fired_by: str, error: str | None
) -> dict[str, Any]:
    """A `schedule_ticks` row (schedules.record_ticks)."""
    return {
        "schedule_id": schedule_id,
        "tick_at": tick,
        "run_id": run_id,
        "fired_by": fired_by,
        "error": error,
    }
