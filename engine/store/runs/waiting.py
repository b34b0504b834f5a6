"""Work waiting for each agent: the supervisor's outage watch (sasflow.supervisor.outage)
asks which agents have steps waiting, and since when, before it asks whether anyone serves
them. Steps bound for an agent pool are left out: a pool's steps wait in the database until an
instance of the pool consumes its queue, and fail on their own terms (store.runs.pools)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Select, func, select

from sasflow.states import StepState
from sasflow.store.runs import queries
from sasflow.store.schema import steps
from sasflow.store.sqltime import now, plus_seconds


@dataclass(frozen=True)
class WaitingWork:
    """An agent's steps waiting for it."""

    agent: str
    pending: int
    """Ready steps (not backing off), not yet claimed."""
    processing: int
    """Steps claimed and dispatched, no reply applied yet."""
    oldest: datetime | None
    """When the longest-waiting of them became ready or was dispatched (database clock)."""

    @property
    def steps(self) -> int:
        return self.pending + self.processing


@cache
def _ready_by_agent() -> Select[Any]:
    """Ready steps of the shared queues per agent, and the oldest's ready time
    (ix_steps_ready)."""
    return (
        select(steps.c.agent, func.count().label("n"), func.min(steps.c.not_before).label("since"))
        .where(
            steps.c.state == StepState.PENDING,
            steps.c.not_before <= now(),
            steps.c.pool.is_(None),
            queries.not_timer(),
        )
        .group_by(steps.c.agent)
    )


@cache
def _in_flight_by_agent() -> Select[Any]:
    """Steps of the shared queues in flight per agent, and the oldest's dispatch time
    (ix_steps_expiry)."""
    return (
        select(
            steps.c.agent, func.count().label("n"), func.min(steps.c.dispatched_at).label("since")
        )
        .where(steps.c.state == StepState.PROCESSING, steps.c.pool.is_(None))
        .group_by(steps.c.agent)
    )


def waiting_work(conn: Connection) -> dict[str, WaitingWork]:
    """Every agent with steps waiting for it (ready or in flight) -> what waits."""
    ready = {r.agent: r for r in conn.execute(_ready_by_agent())}
    flying = {r.agent: r for r in conn.execute(_in_flight_by_agent())}
    found = {}
    for agent in sorted(set(ready) | set(flying)):
        times = [
            r.since for r in (ready.get(agent), flying.get(agent)) if r is not None and r.since
        ]
        found[agent] = WaitingWork(
            agent=agent,
            pending=int(ready[agent].n) if agent in ready else 0,
            processing=int(flying[agent].n) if agent in flying else 0,
            oldest=min(times, default=None),
        )
    return found


@dataclass(frozen=True)
class DeferredAction:
    """Steps of one agent's action deferred (not failed) for a while."""

    agent: str
    action: str
    steps: int
    since: datetime
    """The first deferral of the longest-deferred of them (database clock)."""


def deferred_actions(conn: Connection, *, for_s: float) -> list[DeferredAction]:
    """(agent, action) of the pending steps deferred for at least `for_s` seconds, with their
    count (ix_steps_ready serves the pending steps; a scan of those)."""
    rows = conn.execute(
        select(
            steps.c.agent,
            steps.c.action,
            func.count().label("n"),
            func.min(steps.c.deferred_since).label("since"),
        )
        .where(
            steps.c.state == StepState.PENDING,
            steps.c.deferred_since < plus_seconds(now(), -for_s),
        )
        .group_by(steps.c.agent, steps.c.action)
        .order_by(steps.c.agent, steps.c.action)
    )
    return [DeferredAction(r.agent, r.action, int(r.n), r.since) for r in rows]
