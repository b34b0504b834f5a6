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

from sasflow.errors import InvalidInputError, UnknownWorkflowError
from sasflow.registry import Registry
from sasflow.schedules.timing import CatchUp, Timing, tick_key, ticks_to_fire
from sasflow.store import schedules as store
from sasflow.store import submit_many
from sasflow.store.commands import NewRun
from sasflow.store.db import Connection
from sasflow.store.notify import notify_ready
from sasflow.store.shard import Bounds
from sasflow.store.submit import submit

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
    `isolate`: each tick in a savepoint (see submit_tick). `bounds`: only the schedules whose
    id is within them (the scope strategy's range, checked by the caller's fence).

    Draining (`drain_horizon` given): release each schedule right after its due tick was
    submitted, and at once those whose next tick is more than `drain_horizon` seconds away;
    the others stay held until their tick.
    """
    report = FireReport()
    moves: list[store.Ticked] = []
    fired: list[dict[str, Any]] = []
    batch: list[tuple[int, Target, dt.datetime]] = []  # without `isolate`: fired[i]'s tick
    draining = drain_horizon is not None
    rows, db_now = store.lock_owned(conn, holder, due_only=not draining, limit=limit, bounds=bounds)
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
                if isolate:
                    run_id, error = submit_tick(
                        conn, registry, target, tick, fired_by=fired_by, namespace=namespace
                    )
                else:  # submitted together after the loop
                    run_id, error = None, None
                    batch.append((len(fired), target, tick))
                fired.append(tick_row(row.id, tick, run_id, fired_by, error))
                report.late.append((db_now - tick).total_seconds())
            next_tick_at = timing.next_after(ticks[-1] if behind else db_now)
            release = release and not behind
        report.fired += len(ticks)
        report.released += int(release)
        moves.append(
            store.Ticked(row.id, next_tick_at, ticks[-1] if ticks else None, release=release)
        )
    if batch:
        run_ids = submit_ticks(
            conn,
            registry,
            [(t, tick) for _, t, tick in batch],
            fired_by=fired_by,
            namespace=namespace,
        )
        for (i, _, _), run_id in zip(batch, run_ids, strict=True):
            fired[i]["run_id"] = run_id
    store.record_ticks(conn, fired)
    store.set_ticked(conn, moves)
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


def submit_tick(
    conn: Connection,
    registry: Registry,
    schedule: Target,
    tick: dt.datetime,
    *,
    fired_by: str,
    namespace: str,
) -> tuple[int | None, str | None]:
    """Submit the run of one tick in a savepoint: its run id, or None and why when the run
    cannot be made (unknown workflow, bad input: the caller records the tick with the error,
    never retried). fire_due's fast path submits its ticks together instead (submit_ticks).
    """
    new_run = NewRun(
        workflow=schedule.workflow, input=schedule.input, key=tick_key(schedule.id, tick)
    )
    error: str | None = None
    try:
        with conn.begin_nested():
            # fire_due's caller wakes the schedulers once per batch (notify=False).
            result = submit(
                conn, registry, new_run, namespace=namespace, actor=fired_by, notify=False
            )
    except (UnknownWorkflowError, InvalidInputError) as exc:
        error = str(exc)
    if error is not None:
        log.error(
            "schedule %s (%s): tick %s not submitted: %s", schedule.id, schedule.name, tick, error
        )
        return None, error
    return result.run_id, None


def submit_ticks(
    conn: Connection,
    registry: Registry,
    ticks: Sequence[tuple[Target, dt.datetime]],
    *,
    fired_by: str,
    namespace: str,
) -> list[int]:
    """Submit the runs of a fire batch's ticks together, without savepoints: the runs of
    one-statement workflows in one statement (store.submit_many), the others one at a time.
    A tick whose run cannot be made raises UnknownWorkflowError or InvalidInputError (the data
    refused by the database too): the caller rolls back and fires the batch with `isolate`.
    The caller wakes the schedulers."""
    prepared = [
        submit_many.prepare(
            registry,
            NewRun(workflow=t.workflow, input=t.input, key=tick_key(t.id, tick)),
        )
        for t, tick in ticks
    ]
    together = [p for p in prepared if submit_many.one_statement(conn, p.workflow)]
    done = submit_many.insert(conn, together, actor=fired_by, namespace=namespace, notify=False)
    found = {(p.workflow.name, p.key): r.run_id for p, r in zip(together, done, strict=True)}
    run_ids: list[int] = []
    for p in prepared:
        run_id = found.get((p.workflow.name, p.key))
        if run_id is None:
            run_id = submit(
                conn, registry, p.new, namespace=namespace, actor=fired_by, notify=False
            ).run_id
        run_ids.append(run_id)
    return run_ids


def tick_row(
    schedule_id: int, tick: dt.datetime, run_id: int | None, fired_by: str, error: str | None
) -> dict[str, Any]:
    """A `schedule_ticks` row (store.record_ticks)."""
    return {
        "schedule_id": schedule_id,
        "tick_at": tick,
        "run_id": run_id,
        "fired_by": fired_by,
        "error": error,
    }
