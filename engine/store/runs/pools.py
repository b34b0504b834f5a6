"""Steps waiting for an agent of their pool: handed back to `pending` for a later pass,
counting the looks, until the limits make the scheduler fail them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, func, update

from sasflow.states import StepState
from sasflow.store.dialect import one_of
from sasflow.store.runs.claim import record_handed_back
from sasflow.store.runs.queries import leave_processing
from sasflow.store.schema import steps
from sasflow.store.sqltime import now, plus_seconds


@dataclass(frozen=True)
class PoolLimits:
    """When a step stops waiting for its pool: after `give_up_s` since its first look found
    no agent, or at its `max_looks`th such look (SASFLOW_POOL_GIVE_UP_S / _MAX_LOOKS)."""

    give_up_s: float = 86400
    max_looks: int = 1024
    recheck_s: float = 1.0
    """Seconds until a waiting step is claimed (looked at) again."""


def park(
    conn: Connection, step_ids: Sequence[int], *, locked_by: str, limits: PoolLimits
) -> list[int]:
    """Hand claimed steps whose pool has no agent back to `pending` (their attempt undone: no
    request left), one more look counted; steps past a limit are left claimed for the caller
    to fail. Returns the ids handed back (primary key)."""
    if not step_ids:
        return []
    since = func.coalesce(steps.c.pool_waiting_since, now())
    rows = conn.execute(
        update(steps)
        .where(
            one_of(steps.c.id, "b_step_ids"),
            steps.c.state == StepState.PROCESSING,
            steps.c.locked_by == locked_by,
            steps.c.pool_looks + 1 < limits.max_looks,
            since > plus_seconds(now(), -limits.give_up_s),
        )
        .values(
            state=StepState.PENDING,
            attempt=steps.c.attempt - 1,
            pool_looks=steps.c.pool_looks + 1,
            pool_waiting_since=since,
            not_before=plus_seconds(now(), limits.recheck_s),
            dispatched_at=None,
            **leave_processing(),
        )
        .returning(steps.c.id, steps.c.run_id, steps.c.name, steps.c.attempt, steps.c.pool),
        {"b_step_ids": list(step_ids)},
    ).all()
    record_handed_back(
        conn,
        rows,
        actor=locked_by,
        reasons=[f"waiting for an agent in pool {r.pool}" for r in rows],
        attempt_undone=True,
    )
    return [r.id for r in rows]
