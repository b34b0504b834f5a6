"""Apply agents' progress messages (docs/timeouts.md): `started` moves a step from its envelope
deadline to its execution clock, `heartbeat` pushes the heartbeat clock on, never past the
execution clock. Both are fenced by (step id, attempt) and change nothing on a step that left
`processing`; a `started` changes nothing on a step already started (a duplicate cannot extend
the execution clock), a `heartbeat` nothing on a step not started or without a heartbeat
timeout. One event per `started` applied (from and to `processing`, reason "started"), none per
heartbeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    Update,
    and_,
    bindparam,
    func,
    select,
    update,
)
from sqlalchemy.dialects import postgresql

from sasflow.commands import StepProgress
from sasflow.states import StepState
from sasflow.store.dialect import capabilities, least
from sasflow.store.runs import events
from sasflow.store.schema import steps
from sasflow.store.sqltime import now, plus_seconds

STARTED_REASON = "started"


@dataclass
class ProgressReport:
    started: int = 0
    """Steps whose execution clock started."""
    heartbeats: int = 0
    """Heartbeats that pushed a heartbeat clock on."""
    ignored: int = 0
    """Messages that changed nothing (stale, duplicate, not started, no heartbeat timeout)."""


_start_values: dict[str, Any] = {
    "started_at": now(),
    # At most the timeout: the policy keeps the heartbeat timeout within it.
    "complete_by": plus_seconds(
        now(), func.coalesce(steps.c.heartbeat_timeout_s, steps.c.timeout_s)
    ),
    "wait_expiries": 0,
    "updated_at": now(),
}
_beat_values: dict[str, Any] = {
    "complete_by": least(
        plus_seconds(steps.c.started_at, steps.c.timeout_s),
        plus_seconds(now(), steps.c.heartbeat_timeout_s),
    ),
}
_processing = steps.c.state == StepState.PROCESSING
_started_columns = (steps.c.run_id, steps.c.id, steps.c.name, steps.c.attempt)


def _fenced() -> Any:
    return and_(
        steps.c.id == bindparam("b_step_id"),
        steps.c.attempt == bindparam("b_attempt"),
        _processing,
    )


@cache
def start_step() -> Update:
    """Fenced: the attempt started; its execution (or heartbeat) clock runs from now (primary
    key)."""
    return (
        update(steps)
        .where(_fenced(), steps.c.started_at.is_(None))
        .values(**_start_values)
        .returning(*_started_columns)
    )


@cache
def beat_step() -> Update:
    """Fenced: the started attempt is alive; its heartbeat clock runs again from now (primary
    key)."""
    return (
        update(steps)
        .where(
            _fenced(),
            steps.c.started_at.is_not(None),
            steps.c.heartbeat_timeout_s.is_not(None),
        )
        .values(**_beat_values)
        .returning(steps.c.id)
    )


def _arrays() -> Any:
    return select(
        func.unnest(bindparam("b_step_ids", type_=postgresql.ARRAY(BigInteger))).label("id"),
        func.unnest(bindparam("b_attempts", type_=postgresql.ARRAY(Integer))).label("attempt"),
    ).subquery("signal")


@cache
def start_steps() -> Update:
    """PostgreSQL: `start_step` for many steps in one statement, :b_step_ids and :b_attempts
    parallel arrays (primary key)."""
    signal = _arrays()
    return (
        update(steps)
        .where(
            steps.c.id == signal.c.id,
            steps.c.attempt == signal.c.attempt,
            _processing,
            steps.c.started_at.is_(None),
        )
        .values(**_start_values)
        .returning(*_started_columns)
    )


@cache
def beat_steps() -> Update:
    """PostgreSQL: `beat_step` for many steps in one statement (primary key)."""
    signal = _arrays()
    return (
        update(steps)
        .where(
            steps.c.id == signal.c.id,
            steps.c.attempt == signal.c.attempt,
            _processing,
            steps.c.started_at.is_not(None),
            steps.c.heartbeat_timeout_s.is_not(None),
        )
        .values(**_beat_values)
        .returning(steps.c.id)
    )


def apply_progress(
    conn: Connection, signals: Sequence[StepProgress], *, actor: str, finished: set[tuple[int, int]]
) -> ProgressReport:
    """Apply `signals` in the caller's transaction: the `started` ones first, then the
    heartbeats, each (step, attempt) once. The attempts in `finished` (their reply is in the
    same batch) are left out: the reply ends them anyway."""
    report = ProgressReport()
    starts: dict[tuple[int, int], StepProgress] = {}
    beats: set[tuple[int, int]] = set()
    for signal in signals:
        key = (signal.step_id, signal.attempt)
        if key in finished:
            report.ignored += 1
        elif signal.started and key not in starts:
            starts[key] = signal
        elif not signal.started and key not in beats:
            beats.add(key)
        else:
            report.ignored += 1
    rows = _run(conn, start_step(), start_steps(), sorted(starts))
    events.record(
        conn,
        [
            events.step_event(
                row,
                StepState.PROCESSING,
                StepState.PROCESSING,
                attempt=row.attempt,
                actor=actor,
                reason=STARTED_REASON,
                detail={"agent": starts[(row.id, row.attempt)].agent},
            )
            for row in rows
        ],
    )
    report.started = len(rows)
    report.heartbeats = len(_run(conn, beat_step(), beat_steps(), sorted(beats)))
    report.ignored += len(starts) - report.started + len(beats) - report.heartbeats
    return report


def _run(conn: Connection, one: Update, many: Update, keys: Sequence[tuple[int, int]]) -> list[Any]:
    """The rows `one` changes for each key, or `many` for all at once where the database
    takes arrays (`Capabilities.batched_complete`)."""
    if not keys:
        return []
    if len(keys) > 1 and capabilities(conn).batched_complete:
        values = {"b_step_ids": [k[0] for k in keys], "b_attempts": [k[1] for k in keys]}
        return list(conn.execute(many, values).all())
    rows = []
    for step_id, attempt in keys:
        row = conn.execute(one, {"b_step_id": step_id, "b_attempt": attempt}).first()
        if row is not None:
            rows.append(row)
    return rows
