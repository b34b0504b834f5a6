"""Matching stored events to open event waits, both ways, and the waits' timeouts.

`match` pairs unmatched, unexpired events with open waits of the same name and correlation
(the oldest event first) and completes each wait with its event's payload, in the caller's
transaction: the event row locked (SKIP LOCKED), the wait's run locked (SKIP LOCKED: a run
another transaction holds is matched at the next pass), the step fenced by its state and the
event by `consumed_at`, and a unique index on `consumed_step_id` besides: a wait consumes one
event and an event completes one wait, whatever races. It serves both ways: after an event is
stored (for that event, `event`) and after waits open (every pair, the schedulers' event duty).

`time_out` applies `on_timeout` (from the step's input) to open waits past their deadline;
`expire` deletes unmatched events past their retention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Row

from sasflow.commands import FinishedRun, StoredError
from sasflow.registry import Registry
from sasflow.states import StepState
from sasflow.store.inbound import queries
from sasflow.store.runs import events
from sasflow.store.runs import queries as run_queries
from sasflow.store.runs.completed import advance_completed
from sasflow.waits import OnTimeout


@dataclass
class MatchReport:
    """What a pass of `match` or `time_out` did."""

    completed: int = 0
    """Waits completed by an event (match) or ended by their timeout (time_out)."""
    matched: dict[int, int] = field(default_factory=dict)
    """Stored event (row id) -> the step it completed."""
    ready: int = 0
    deferred: int = 0
    finished: dict[int, FinishedRun] = field(default_factory=dict)
    full: bool = False
    """The batch was full: more may be due now."""


def match(
    conn: Connection,
    registry: Registry | None,
    *,
    batch: int,
    namespace: str,
    actor: str,
    event: int | None = None,
) -> MatchReport:
    """Complete open waits with their stored events (see the module docstring); `event`: only
    that stored event (its row id). Without a registry (an ingress) the runs advance as far as
    the stored rows allow, and a scheduler's advance duty does the rest."""
    report = MatchReport()
    statement = queries.matches() if event is None else queries.matches_of_event()
    pairs = conn.execute(statement, {"b_batch": batch, "b_event": event}).all()
    report.full = len(pairs) >= batch
    if not pairs:
        return report
    locked = _lock_runs(conn, pairs)
    used_steps: set[int] = set()
    recorded = []
    for pair in pairs:
        if pair.run_id not in locked or pair.event in report.matched:
            continue
        if pair.step_id in used_steps:
            continue
        done = conn.execute(
            queries.complete_wait(), {"b_id": pair.step_id, "b_output": pair.payload}
        ).one_or_none()
        used_steps.add(pair.step_id)
        if done is None:
            continue  # completed, timed out, skipped or cancelled meanwhile
        conn.execute(queries.consume_event(), {"b_event": pair.event, "b_step": pair.step_id})
        report.matched[pair.event] = pair.step_id
        recorded.append(
            events.step_event(
                done,
                StepState.PENDING,
                StepState.PROCESSED,
                actor=actor,
                reason="event",
                detail={
                    "event": pair.name,
                    "event_id": pair.event_id,
                    "correlation": pair.correlation,
                },
            )
        )
    report.completed = len(report.matched)
    advance_completed(
        conn,
        registry,
        {r.run_id for r in pairs if r.step_id in report.matched.values()},
        recorded,
        report,
        namespace=namespace,
        actor=actor,
    )
    return report


def time_out(
    conn: Connection, registry: Registry | None, *, batch: int, namespace: str, actor: str
) -> MatchReport:
    """Apply `on_timeout` to up to `batch` open waits past their timeout: the step completes
    with the default, or fails (`EventTimeoutError`; with "compensate" its error says so and the
    run compensates whatever its failure policy, store.runs.decide)."""
    report = MatchReport()
    due = conn.execute(queries.due_timeouts(), {"b_batch": batch}).all()
    report.full = len(due) >= batch
    if not due:
        return report
    locked = _lock_runs(conn, due)
    recorded = []
    ended: set[int] = set()
    for row in due:
        if row.run_id not in locked:
            continue
        wait = row.input if isinstance(row.input, dict) else {}
        action = wait.get("on_timeout", OnTimeout.FAIL)
        values: dict[str, Any] = {"b_id": row.id, "b_output": None, "b_error": None}
        if action == OnTimeout.DEFAULT:
            values |= {"b_state": StepState.PROCESSED, "b_output": wait.get("default")}
        else:
            extra = {"compensate": True} if action == OnTimeout.COMPENSATE else {}
            missing = (
                f"no decision on approval {row.name!r}"
                if "approval" in wait
                else f"no {wait.get('event')!r} event for correlation {wait.get('correlation')!r}"
            )
            error = StoredError(
                "EventTimeoutError", f"{missing} within {wait.get('timeout_s')} s", extra
            )
            values |= {"b_state": StepState.ERROR, "b_error": error.to_json()}
        done = conn.execute(queries.time_out(), values).one_or_none()
        if done is None:
            continue
        ended.add(done.run_id)
        recorded.append(
            events.step_event(
                done,
                StepState.PENDING,
                StepState(values["b_state"]),
                actor=actor,
                reason="event timeout",
                detail={"on_timeout": action},
            )
        )
    report.completed = len(recorded)
    advance_completed(conn, registry, ended, recorded, report, namespace=namespace, actor=actor)
    return report


def expire(conn: Connection, *, batch: int) -> int:
    """Delete up to `batch` unmatched events past their retention; how many."""
    return conn.execute(queries.expire(), {"b_batch": batch}).rowcount


def seconds_until_next_timeout(conn: Connection) -> float | None:
    """Seconds, on the database clock, until the earliest open wait times out (0.0: one is due
    now); None when no wait is open."""
    row = conn.execute(queries.next_timeout()).one()
    if row.due is None:
        return None
    remaining: float = (row.due - row.now).total_seconds()
    return max(0.0, remaining)


def _lock_runs(conn: Connection, rows: Sequence[Row[Any]]) -> set[int]:
    ids = sorted({r.run_id for r in rows})
    return set(conn.execute(run_queries.lock_runs(skip_locked=True), {"b_run_ids": ids}).scalars())
