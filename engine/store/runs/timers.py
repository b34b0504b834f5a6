"""Timer steps (`Step.sleep`) coming due: no agent runs them. A sleeping timer is a `pending`
step of the reserved agent `TIMER_AGENT` whose `not_before` is its wake-up time; the claim
never takes it (`queries.claimable`), and it sits in its own partial index (`ix_steps_timers`),
not in the claim's, so a million sleeping timers cost the claim nothing. The schedulers' timer
duty (sasflow.scheduler.timers) calls `fire_due`: due timers are marked processed, with their
events, and their runs advanced, in the caller's transaction; `seconds_until_next` says when
the next one is due, to sleep until then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Select, Update, bindparam, func, select, update

from sasflow.commands import FinishedRun
from sasflow.registry import Registry
from sasflow.states import ACTIVE_RUN_STATES, StepState
from sasflow.store.runs import events, queries
from sasflow.store.runs.completed import advance_completed
from sasflow.store.schema import runs, steps
from sasflow.store.sqltime import now
from sasflow.workflow import TIMER_AGENT


@dataclass
class FireReport:
    """What a pass of `fire_due` did."""

    fired: int = 0
    ready: int = 0
    deferred: int = 0
    finished: dict[int, FinishedRun] = field(default_factory=dict)
    full: bool = False
    """The batch was full: more timers may be due now."""


@cache
def due_timers() -> Select[Any]:
    """Up to :b_batch timer steps of active runs due now, earliest first (ix_steps_timers)."""
    return (
        select(steps.c.id, steps.c.run_id, steps.c.not_before)
        .join(runs, runs.c.id == steps.c.run_id)
        .where(
            steps.c.state == StepState.PENDING,
            steps.c.agent == TIMER_AGENT,
            steps.c.not_before <= now(),
            runs.c.state.in_(ACTIVE_RUN_STATES),
        )
        .order_by(steps.c.not_before, steps.c.id)
        .limit(bindparam("b_batch"))
    )


@cache
def fire_timer() -> Update:
    """Fenced: a due timer step still pending becomes processed with its output (primary
    key)."""
    return (
        update(steps)
        .where(
            steps.c.id == bindparam("b_id"),
            steps.c.state == StepState.PENDING,
            steps.c.agent == TIMER_AGENT,
            steps.c.not_before <= now(),
        )
        .values(
            state=StepState.PROCESSED,
            output=bindparam("b_output"),
            locked_by=None,
            updated_at=now(),
        )
        .returning(steps.c.id, steps.c.run_id, steps.c.name)
    )


@cache
def next_timer() -> Select[Any]:
    """When the earliest sleeping timer step is due, and the database's time now
    (ix_steps_timers)."""
    return select(func.min(steps.c.not_before).label("due"), now().label("now")).where(
        steps.c.state == StepState.PENDING, steps.c.agent == TIMER_AGENT
    )


def fire_due(
    conn: Connection, registry: Registry, *, batch: int, namespace: str, actor: str
) -> FireReport:
    """Mark up to `batch` due timer steps processed (`{"slept_until": ...}`, their wake-up
    time) and advance their runs. Runs another transaction holds are left for the next pass
    (SKIP LOCKED): a timer fires once, fenced by its state under its run's lock."""
    report = FireReport()
    due = conn.execute(due_timers(), {"b_batch": batch}).all()
    report.full = len(due) >= batch
    if not due:
        return report
    locked = set(
        conn.execute(
            queries.lock_runs(skip_locked=True), {"b_run_ids": sorted({r.run_id for r in due})}
        ).scalars()
    )
    fired_runs: set[int] = set()
    recorded = []
    for row in due:
        if row.run_id not in locked:
            continue
        slept_until = _iso(row.not_before)
        fired = conn.execute(
            fire_timer(), {"b_id": row.id, "b_output": {"slept_until": slept_until}}
        ).one_or_none()
        if fired is None:
            continue  # cancelled, skipped or fired meanwhile
        report.fired += 1
        fired_runs.add(fired.run_id)
        recorded.append(
            events.step_event(
                fired,
                StepState.PENDING,
                StepState.PROCESSED,
                actor=actor,
                reason="timer",
                detail={"slept_until": slept_until},
            )
        )
    advance_completed(
        conn, registry, fired_runs, recorded, report, namespace=namespace, actor=actor
    )
    return report


def seconds_until_next(conn: Connection) -> float | None:
    """Seconds, on the database clock, until the earliest sleeping timer is due (0.0: one is
    due now); None when no timer sleeps."""
    row = conn.execute(next_timer()).one()
    if row.due is None:
        return None
    remaining: float = (row.due - row.now).total_seconds()
    return max(0.0, remaining)


def _iso(moment: datetime) -> str:
    return moment.isoformat()
