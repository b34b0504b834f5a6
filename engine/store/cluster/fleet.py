"""The `agent_instances` table: the fleet view written from agents' heartbeats (through a
scheduler), the supervisor's loss detection, and the operators' list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Row, and_, case, delete, func, select, update

from sasflow.states import LOST_AFTER_MISSED, AgentState
from sasflow.store.dialect import upsert_insert
from sasflow.store.schema import agent_instances, steps
from sasflow.store.sqltime import now, plus_seconds


@dataclass(frozen=True)
class InstanceReport:
    """What one heartbeat says of an agent instance (the store's command, not the wire form)."""

    instance_id: str
    agent: str
    hostname: str
    pid: int
    version: str
    concurrency: int
    in_flight: int
    breakers: dict[str, str]
    interval_s: float
    seq: int = 0
    """Counts the instance's heartbeats: an older one than recorded is ignored."""
    stopping: bool = False
    """The instance's goodbye on a clean exit."""
    actions: dict[str, str | None] | None = None
    """Action -> the dependency it uses (None: the agent did not say)."""
    breakers_open_for_s: dict[str, float] = field(default_factory=dict)
    """Open breaker -> seconds until its trial call, as of this heartbeat."""
    held: int = 0
    """Threads held by handlers past their deadline; = concurrency: wedged."""


_NOT_COLUMNS = frozenset({"stopping", "breakers_open_for_s"})


def record_heartbeats(conn: Connection, reports: Sequence[InstanceReport]) -> None:
    """Insert or refresh one row per instance, `heartbeat_at` on the database clock (primary
    key). A goodbye marks it stopped; any other heartbeat makes it live again (a `lost`
    instance that was only cut off comes back). A heartbeat whose `seq` is below the one
    recorded changes nothing."""
    latest: dict[str, InstanceReport] = {}  # one row per instance and statement
    for report in reports:
        known = latest.get(report.instance_id)
        if known is None or known.seq <= report.seq:
            latest[report.instance_id] = report
    rows = [
        {
            **{k: v for k, v in asdict(r).items() if k not in _NOT_COLUMNS},
            "breakers_open_for": r.breakers_open_for_s,
            "state": AgentState.STOPPED if r.stopping else AgentState.LIVE,
        }
        for r in latest.values()
    ]
    if not rows:
        return
    insert = upsert_insert(conn, agent_instances)
    refreshed = {key: insert.excluded[key] for key in rows[0] if key != "instance_id"}
    stopped = insert.excluded.state == AgentState.STOPPED
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=[agent_instances.c.instance_id],
            set_={
                **refreshed,
                "heartbeat_at": now(),
                "gone_at": case((stopped, now()), else_=None),
            },
            where=agent_instances.c.seq <= insert.excluded.seq,
        ),
        rows,
    )


def mark_lost(conn: Connection) -> Sequence[Row[Any]]:
    """Mark lost every live instance whose last heartbeat is older than LOST_AFTER_MISSED of
    its intervals, on the database clock; the instances changed (ix_agent_instances_live)."""
    overdue = plus_seconds(
        agent_instances.c.heartbeat_at, agent_instances.c.interval_s * LOST_AFTER_MISSED
    )
    return conn.execute(
        update(agent_instances)
        .where(agent_instances.c.state == AgentState.LIVE, overdue < now())
        .values(state=AgentState.LOST, gone_at=now())
        .returning(
            agent_instances.c.instance_id,
            agent_instances.c.agent,
            agent_instances.c.hostname,
            agent_instances.c.pid,
            agent_instances.c.heartbeat_at,
            agent_instances.c.in_flight,
        )
    ).all()


def wedged_instances(conn: Connection) -> Sequence[Row[Any]]:
    """Live instances whose every worker thread is held past deadline, as of their last
    heartbeat (a scan of a table as small as the fleet)."""
    rows = conn.execute(
        select(
            agent_instances.c.instance_id,
            agent_instances.c.agent,
            agent_instances.c.hostname,
            agent_instances.c.pid,
            agent_instances.c.held,
            agent_instances.c.concurrency,
            agent_instances.c.heartbeat_at,
        ).where(
            agent_instances.c.state == AgentState.LIVE,
            agent_instances.c.concurrency > 0,
            agent_instances.c.held >= agent_instances.c.concurrency,
        )
    ).all()
    return cast("Sequence[Row[Any]]", rows)


@dataclass(frozen=True)
class Presence:
    """What the fleet view says of one agent."""

    live: int
    """Instances heartbeating now."""
    last_heard: datetime | None
    """The latest heartbeat of any of its instances (database clock); None: never seen, or
    forgotten."""


def presence(conn: Connection, agents: Sequence[str]) -> dict[str, Presence]:
    """`agents` -> their live instances and when any was last heard of (a scan of a table as
    small as the fleet's recent history); an agent never seen has no live instance."""
    if not agents:
        return {}
    live = func.count().filter(agent_instances.c.state == AgentState.LIVE)
    rows = conn.execute(
        select(
            agent_instances.c.agent,
            live.label("live"),
            func.max(agent_instances.c.heartbeat_at).label("last_heard"),
        )
        .where(agent_instances.c.agent.in_(list(agents)))
        .group_by(agent_instances.c.agent)
    ).all()
    found = {r.agent: Presence(int(r.live), r.last_heard) for r in rows}
    return {a: found.get(a, Presence(0, None)) for a in agents}


def forget_gone(conn: Connection, *, after_s: float) -> int:
    """Delete instances stopped or lost more than `after_s` seconds ago (a sequential scan of
    a table as small as the fleet's recent history)."""
    gone = and_(
        agent_instances.c.state != AgentState.LIVE,
        agent_instances.c.gone_at < plus_seconds(now(), -after_s),
    )
    return conn.execute(delete(agent_instances).where(gone)).rowcount


def find_instances(
    conn: Connection, *, agent: str | None, include_gone: bool
) -> list[dict[str, Any]]:
    """Every column of the instances (of one agent when `agent` is given), by agent and host,
    with `seconds_since_heartbeat` on the database clock; stopped ones only when
    `include_gone` (a scan of a table as small as the fleet)."""
    query = select(agent_instances, now().label("now")).order_by(
        agent_instances.c.agent, agent_instances.c.hostname, agent_instances.c.pid
    )
    if agent is not None:
        query = query.where(agent_instances.c.agent == agent)
    if not include_gone:
        query = query.where(agent_instances.c.state != AgentState.STOPPED)
    found = []
    for row in conn.execute(query):
        values = dict(row._mapping)
        clock = values.pop("now")
        values["seconds_since_heartbeat"] = (clock - values["heartbeat_at"]).total_seconds()
        found.append(values)
    return found


def known_agent_queues(conn: Connection) -> list[tuple[str, str | None]]:
    """Every (agent, pool) the store knows of, from its steps and its fleet (pool None: the
    agent's shared queue); for commands that act on every agent queue. Scans `steps`."""
    found: set[tuple[str, str | None]] = set()
    for agent, pool in conn.execute(select(steps.c.agent, steps.c.pool).distinct()):
        found.add((agent, None))
        if pool is not None:
            found.add((agent, pool))
    for (agent,) in conn.execute(select(agent_instances.c.agent).distinct()):
        found.add((agent, None))
    return sorted(found, key=lambda pair: (pair[0], pair[1] or ""))
