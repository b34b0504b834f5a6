"""What the claim learns from the agent fleet (agent_instances, written from heartbeats): the
capacity of each agent's live instances, the actions that use each dependency, and the breakers
that are open somewhere. Read when a scheduler refreshes its flow plan (store/flow/plan.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select

from sasflow.states import LOST_AFTER_MISSED, AgentState
from sasflow.store.schema import agent_instances
from sasflow.store.sqltime import now

OPEN_STATES = frozenset({"open", "half-open"})


@dataclass(frozen=True)
class OpenBreaker:
    """A dependency's breaker that a live instance of `agent` reports open or half-open."""

    agent: str
    dependency: str
    until: datetime
    """When the last of those instances lets a trial call through (database clock); past or
    now for a half-open breaker, or an instance too old to say how long it stays open."""


@dataclass(frozen=True)
class FleetView:
    known: frozenset[str] = frozenset()
    """Agents with instance rows (live or not): the fleet bound applies to them only."""
    capacity: Mapping[str, int] = field(default_factory=dict)
    """Agent -> its live instances' summed concurrency (absent: none live)."""
    uses: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    """(agent, dependency) -> the actions its live instances report using it."""
    open_breakers: tuple[OpenBreaker, ...] = ()
    reporting: frozenset[str] = frozenset()
    """Agents whose live instances report their actions (the rest are too old to)."""


def read_fleet(conn: Connection) -> FleetView:
    """The fleet as the claim sees it: an instance is live when its row says so and its last
    heartbeat is within LOST_AFTER_MISSED intervals, on the database clock (a scan of a table
    as small as the fleet's recent history)."""
    rows = conn.execute(
        select(
            agent_instances.c.agent,
            agent_instances.c.state,
            agent_instances.c.concurrency,
            agent_instances.c.interval_s,
            agent_instances.c.heartbeat_at,
            agent_instances.c.actions,
            agent_instances.c.breakers,
            agent_instances.c.breakers_open_for,
            now().label("db_now"),
        )
    ).all()
    known: set[str] = set()
    capacity: dict[str, int] = {}
    uses: dict[tuple[str, str], set[str]] = {}
    until: dict[tuple[str, str], datetime] = {}
    reporting: set[str] = set()
    for row in rows:
        known.add(row.agent)
        if not _live(row):
            continue
        capacity[row.agent] = capacity.get(row.agent, 0) + int(row.concurrency)
        if row.actions is not None:
            reporting.add(row.agent)
            for action, dependency in dict(row.actions).items():
                if dependency is not None:
                    uses.setdefault((row.agent, str(dependency)), set()).add(str(action))
        open_for = dict(row.breakers_open_for or {})
        for dependency, state in dict(row.breakers or {}).items():
            if state in OPEN_STATES:
                seconds = float(open_for.get(dependency, 0.0)) if state == "open" else 0.0
                ends = row.heartbeat_at + timedelta(seconds=seconds)
                key = (row.agent, str(dependency))
                until[key] = max(until.get(key, ends), ends)
    return FleetView(
        known=frozenset(known),
        capacity=capacity,
        uses={k: frozenset(v) for k, v in uses.items()},
        open_breakers=tuple(OpenBreaker(a, d, t) for (a, d), t in sorted(until.items())),
        reporting=frozenset(reporting),
    )


def _live(row: Any) -> bool:
    if row.state != AgentState.LIVE:
        return False
    silent = (row.db_now - row.heartbeat_at).total_seconds()
    return bool(silent <= row.interval_s * LOST_AFTER_MISSED)
