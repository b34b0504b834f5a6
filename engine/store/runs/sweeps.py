"""The supervisor sweep's statements: expired steps, dead-lettered attempts, stalled agents.

Most are the engine's hot statements (`sasflow.store.runs.queries`); these functions run them with
their parameters, so the sweep (`sasflow.supervisor.sweep`)
decides what to do and names no table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from sqlalchemy import Connection, Row, Select, Update, bindparam, select, update

from sasflow.states import StepState
from sasflow.store.dialect import one_of
from sasflow.store.runs import queries
from sasflow.store.schema import steps
from sasflow.store.sqltime import now


@cache
def runs_of_steps() -> Select[Any]:
    """The run of each of the given steps, once per step (primary key)."""
    return select(steps.c.run_id).where(one_of(steps.c.id, "b_step_ids"))


def expired_runs(conn: Connection, *, batch: int) -> list[int]:
    """The runs of up to `batch` expired steps, oldest deadline first (a run once per expired
    step it holds)."""
    return list(conn.execute(queries.expired_runs(), {"b_batch": batch}).scalars())


def lock_runs(conn: Connection, run_ids: Sequence[int], *, skip_locked: bool) -> list[int]:
    """Lock the runs `run_ids` in id order; with `skip_locked`, only those no other transaction
    holds (returned), else waiting for each."""
    return list(
        conn.execute(queries.lock_runs(skip_locked), {"b_run_ids": list(run_ids)}).scalars()
    )


_processing = steps.c.state == StepState.PROCESSING


@cache
def expired_steps() -> Select[Any]:
    """The expired processing steps of the (locked) runs :b_run_ids, with what tells which
    clock ran out, locked, skipping rows another sweeper holds (uq_steps_run_id_kind_name, by
    run). Under READ COMMITTED the lock re-checks the conditions on the newest row version, so
    an expiry is never recorded twice; the statements below then change these rows by id."""
    return (
        select(
            steps.c.id,
            steps.c.run_id,
            steps.c.attempt,
            steps.c.started_at,
            steps.c.complete_by,
            steps.c.timeout_s,
            steps.c.wait_timeout_s,
            steps.c.heartbeat_timeout_s,
        )
        .where(_processing, steps.c.complete_by < now(), one_of(steps.c.run_id, "b_run_ids"))
        .order_by(steps.c.id)
        .with_for_update(skip_locked=True)
    )


@cache
def count_failures_of() -> Update:
    """Count one failure, with :b_error, for the (locked) processing steps :b_step_ids
    (primary key)."""
    return (
        update(steps)
        .where(one_of(steps.c.id, "b_step_ids"), _processing)
        .values(**queries.failure_values())
        .returning(*queries.FAILURE_RESULT)
    )


def _wait_values() -> dict[str, Any]:
    """SET clause of a wait-clock expiry: pending again now, no failure counted, the attempt
    kept (it fences a late reply), one more wait expiry in a row."""
    return {
        "state": StepState.PENDING,
        "not_before": now(),
        "error": bindparam("b_error"),
        "wait_expiries": steps.c.wait_expiries + 1,
        **queries.leave_processing(),
    }


@cache
def return_waited_of() -> Update:
    """Wait-clock expiry, with :b_error, of the (locked) processing steps :b_step_ids (primary
    key)."""
    return (
        update(steps)
        .where(one_of(steps.c.id, "b_step_ids"), _processing)
        .values(**_wait_values())
        .returning(*queries.FAILURE_RESULT)
    )


@cache
def return_waited_fenced() -> Update:
    """Fenced: wait-clock expiry of attempt :b_attempt of step :b_step_id if no agent started
    it (primary key)."""
    return (
        update(steps)
        .where(
            steps.c.id == bindparam("b_step_id"),
            steps.c.attempt == bindparam("b_attempt"),
            _processing,
            steps.c.started_at.is_(None),
        )
        .values(**_wait_values())
        .returning(*queries.FAILURE_RESULT)
    )


def take_expired(conn: Connection, run_ids: Sequence[int]) -> Sequence[Row[Any]]:
    """The expired steps of the (locked) runs `run_ids`, locked (`expired_steps`)."""
    return conn.execute(expired_steps(), {"b_run_ids": list(run_ids)}).all()


def count_failures(conn: Connection, step_ids: Sequence[int], *, error: Any) -> Sequence[Row[Any]]:
    """Count one failure, with `error`, for the steps `step_ids` (locked, processing); the
    steps changed."""
    return conn.execute(count_failures_of(), {"b_step_ids": list(step_ids), "b_error": error}).all()


def return_waited(conn: Connection, step_ids: Sequence[int], *, error: Any) -> Sequence[Row[Any]]:
    """Make the steps `step_ids` (locked, processing) pending again, uncharged, with `error`
    (the wait clock); the steps changed."""
    return conn.execute(return_waited_of(), {"b_step_ids": list(step_ids), "b_error": error}).all()


def return_not_taken(
    conn: Connection, *, step_id: int, attempt: int, error: Any
) -> Row[Any] | None:
    """Fenced: the wait clock of attempt `attempt` of step `step_id`, if it is still
    processing and no agent started it; the step changed, or None."""
    return conn.execute(
        return_waited_fenced(), {"b_step_id": step_id, "b_attempt": attempt, "b_error": error}
    ).first()


def count_failure(conn: Connection, *, step_id: int, attempt: int, error: Any) -> Row[Any] | None:
    """Fenced: count one failure of attempt `attempt` of step `step_id` if it is still
    processing; the step changed, or None (queries.count_failure)."""
    return conn.execute(
        queries.count_failure(), {"b_step_id": step_id, "b_attempt": attempt, "b_error": error}
    ).first()


def runs_of(conn: Connection, step_ids: Sequence[int]) -> list[int]:
    """The runs owning the steps `step_ids`, each once, in id order (not locked)."""
    return sorted(set(conn.execute(runs_of_steps(), {"b_step_ids": list(step_ids)}).scalars()))


def stalled_agents(conn: Connection, *, stalled_after: float) -> Sequence[Row[Any]]:
    """Per agent, its ready steps nobody claimed for `stalled_after` seconds: `agent`, `steps`
    (how many) and `since` (the oldest's ready time)."""
    return conn.execute(queries.stalled_steps(), {"b_stalled_after": stalled_after}).all()


@dataclass
class SweepReport:
    """What one sweep did (printed by `sasflow supervisor --once`)."""

    reclaimed: int = 0
    """Expired steps made pending again (after their backoff)."""
    waited: int = 0
    """Steps whose wait clock ran out (no agent took them): pending again, no failure counted
    (not in `reclaimed`)."""
    escalated: int = 0
    """Steps that reached their failure threshold and went to error."""
    parked: int = 0
    """Steps that reached their failure threshold and parked (their policy parks them)."""
    compensations: int = 0
    """Runs whose failure started compensation."""
    alerts: list[int] = field(default_factory=list)
    dead_requests: int = 0
    """Dead-lettered requests counted as failures before their deadline."""
    pruned: int = 0
    """Finished runs deleted past their retention."""
    inbound_pruned: int = 0
    """Inbound events consumed by the waits of those runs, deleted with them."""
    audit_pruned: int = 0
    """Audit records deleted past their retention."""
    subscribers_expired: int = 0
    """Stream subscribers away past their expiry, expired (their updates deleted after)."""
    updates_deleted: int = 0
    """Unacknowledged updates of expired subscribers deleted."""
    dead_letters_expired: int = 0
    """Dead letters removed from <ns>.dead past their age or beyond its bound (audited)."""
    agents_lost: int = 0
    """Agent instances that missed their heartbeats (sasflow.supervisor.fleet)."""
    deadlines: int = 0
    """Runs whose deadline passed (an alert, a cancel or a compensation each)."""
    seconds: float = 0.0
    complete: bool = True
    """False when the time budget ran out with expired steps left."""

    def summary(self) -> str:
        counts = {
            "reclaimed": self.reclaimed,
            "escalated": self.escalated,
            "compensations": self.compensations,
            "alerts": len(self.alerts),
            "dead_requests": self.dead_requests,
            "pruned": self.pruned,
            "agents_lost": self.agents_lost,
            "waited": self.waited,
            "deadlines": self.deadlines,
        }
        retention = {  # shown when something was done
            "parked": self.parked,
            "inbound_pruned": self.inbound_pruned,
            "audit_pruned": self.audit_pruned,
            "subscribers_expired": self.subscribers_expired,
            "updates_deleted": self.updates_deleted,
            "dead_letters_expired": self.dead_letters_expired,
        }
        parts = [f"{k}={v}" for k, v in counts.items()]
        parts += [f"{k}={v}" for k, v in retention.items() if v]
        parts.append(f"seconds={self.seconds:.3f}")
        if not self.complete:
            parts.append("incomplete=budget")
        return " ".join(parts)
