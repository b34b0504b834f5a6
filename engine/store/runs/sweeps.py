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

from sqlalchemy import Connection, Row, Select, select

from sasflow.store.dialect import one_of
from sasflow.store.runs import queries
from sasflow.store.schema import steps


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


def count_expired(conn: Connection, run_ids: Sequence[int], *, error: Any) -> Sequence[Row[Any]]:
    """Count one failure, with `error`, for every expired step of the (locked) runs `run_ids`;
    the steps changed (queries.sweep_expired)."""
    return conn.execute(
        queries.sweep_expired(), {"b_run_ids": list(run_ids), "b_error": error}
    ).all()


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
    escalated: int = 0
    """Steps that reached their failure threshold and went to error."""
    compensations: int = 0
    """Runs whose failure started compensation."""
    alerts: list[int] = field(default_factory=list)
    dead_requests: int = 0
    """Dead-lettered requests counted as failures before their deadline."""
    pruned: int = 0
    """Finished runs deleted past their retention."""
    agents_lost: int = 0
    """Agent instances that missed their heartbeats (sasflow.supervisor.fleet)."""
    seconds: float = 0.0
    complete: bool = True
    """False when the time budget ran out with expired steps left."""

    def summary(self) -> str:
        return (
            f"reclaimed={self.reclaimed} escalated={self.escalated} "
            f"compensations={self.compensations} alerts={len(self.alerts)} "
            f"dead_requests={self.dead_requests} pruned={self.pruned} "
            f"agents_lost={self.agents_lost} "
            f"seconds={self.seconds:.3f}" + ("" if self.complete else " incomplete=budget")
        )
