"""The scheduler registry: one row per registration with a lease on the database clock (the
"ephemeral node" of docs/cluster.md), and the offline (drain) list, keyed by scheduler name."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, delete, exists, func, insert, select, update

from sasflow.store.dialect import upsert_insert
from sasflow.store.schema import scheduler_offline, schedulers, schedules
from sasflow.store.sqltime import now, plus_seconds


@dataclass(frozen=True)
class Registration:
    """What a scheduler registers: `id` is new at every registration, `name` is stable."""

    id: str
    name: str
    address: str
    hostname: str
    pid: int
    fault_tolerance: int
    alarm_threshold: int | None
    lease_ttl: float
    assignment: str = "acquire"
    workflows: tuple[tuple[str, int], ...] = ()
    """The (workflow, version) pairs it has loaded: who can advance which runs."""


@dataclass(frozen=True)
class Renewal:
    """A renewed lease: whether the scheduler is on the offline list, and the database time."""

    offline: bool
    at: datetime


def live() -> Any:
    """The condition "this registration's lease has not expired" (database clock)."""
    return schedulers.c.lease_expires_at > now()


def _is_offline(name: Any) -> Any:
    return exists().where(scheduler_offline.c.name == name)


DEAD_KEPT_S = 86400.0
"""How long `schedulers list` keeps showing a dead registration."""


def register(conn: Connection, reg: Registration) -> bool:
    """Record a registration unless a live one holds the name; a dead one of the same name is
    replaced, and registrations dead for DEAD_KEPT_S are removed (ix_schedulers_name,
    ix_schedulers_lease_expires_at). False when the name is taken."""
    taken = conn.execute(
        select(schedulers.c.id, live().label("live"))
        .where(schedulers.c.name == reg.name)
        .with_for_update()
    ).all()
    if any(row.live for row in taken):
        return False
    conn.execute(delete(schedulers).where(schedulers.c.name == reg.name))
    # Rows dead for a day go too (a default name, host:pid, never registers again).
    conn.execute(
        delete(schedulers).where(schedulers.c.lease_expires_at < plus_seconds(now(), -DEAD_KEPT_S))
    )
    conn.execute(
        insert(schedulers).values(
            id=reg.id,
            name=reg.name,
            address=reg.address,
            hostname=reg.hostname,
            pid=reg.pid,
            fault_tolerance=reg.fault_tolerance,
            alarm_threshold=reg.alarm_threshold,
            lease_ttl_s=reg.lease_ttl,
            assignment=reg.assignment,
            workflows=[list(key) for key in reg.workflows],
            lease_expires_at=plus_seconds(now(), reg.lease_ttl),
        )
    )
    return True


def renew(
    conn: Connection,
    reg_id: str,
    *,
    ttl: float,
    held: int,
    claimed: int,
    applied: int,
    stopping: bool,
) -> Renewal | None:
    """Push an unexpired lease out by `ttl` and record the figures (primary key); None when the
    lease expired or the row is gone (the scheduler must register again)."""
    row = conn.execute(
        update(schedulers)
        .where(schedulers.c.id == reg_id, live())
        .values(
            lease_expires_at=plus_seconds(now(), ttl),
            heartbeat_at=now(),
            held=held,
            claimed=claimed,
            applied=applied,
            draining=stopping,
        )
        .returning(_is_offline(schedulers.c.name).label("offline"), now().label("at"))
    ).first()
    return None if row is None else Renewal(bool(row.offline), row.at)


def deregister(conn: Connection, reg_id: str) -> None:
    """Release what a stopping scheduler holds and remove its row (ix_schedules_owner_next_tick_at,
    primary key)."""
    conn.execute(update(schedules).where(schedules.c.owner == reg_id).values(owner=None))
    conn.execute(delete(schedulers).where(schedulers.c.id == reg_id))


def count_live(conn: Connection) -> int:
    """S: live schedulers, draining ones included (ix_schedulers_lease_expires_at)."""
    return int(conn.execute(select(func.count()).where(live())).scalar_one())


def cluster(conn: Connection) -> list[dict[str, Any]]:
    """Every registration with its liveness, offline flag, X (schedules it holds) and lease age
    in seconds, by name (a scan of the registry, a handful of rows)."""
    held = (
        select(func.count())
        .where(schedules.c.owner == schedulers.c.id)
        .correlate(schedulers)
        .scalar_subquery()
    )
    rows = conn.execute(
        select(
            schedulers.c.id,
            schedulers.c.name,
            schedulers.c.address,
            schedulers.c.fault_tolerance,
            schedulers.c.alarm_threshold,
            schedulers.c.lease_ttl_s,
            schedulers.c.assignment,
            schedulers.c.heartbeat_at,
            schedulers.c.lease_expires_at,
            live().label("live"),
            _is_offline(schedulers.c.name).label("offline"),
            held.label("held"),
            now().label("now"),
        ).order_by(schedulers.c.name)
    )
    return [dict(r._mapping) for r in rows]


def offline_list(conn: Connection) -> list[dict[str, Any]]:
    """The offline list, by name (primary key)."""
    rows = conn.execute(select(scheduler_offline).order_by(scheduler_offline.c.name))
    return [dict(r._mapping) for r in rows]


def name_known(conn: Connection, name: str) -> bool:
    """Whether a registration (live or dead) or an offline entry has this name
    (ix_schedulers_name, primary key)."""
    return bool(
        conn.execute(
            select(exists().where(schedulers.c.name == name) | _is_offline(name))
        ).scalar_one()
    )


def offline(conn: Connection, name: str) -> bool:
    """Whether `name` is on the offline list (primary key)."""
    return bool(conn.execute(select(_is_offline(name))).scalar_one())


def set_offline(conn: Connection, name: str, *, actor: str, reason: str | None) -> bool:
    """Put `name` on the offline list; False when it was on it already (primary key)."""
    added = conn.execute(
        upsert_insert(conn, scheduler_offline)
        .values(name=name, actor=actor, reason=reason)
        .on_conflict_do_nothing(index_elements=[scheduler_offline.c.name])
        .returning(scheduler_offline.c.name)
    ).scalar_one_or_none()
    return added is not None


def clear_offline(conn: Connection, name: str) -> bool:
    """Take `name` off the offline list; False when it was not on it (primary key)."""
    removed = conn.execute(
        delete(scheduler_offline)
        .where(scheduler_offline.c.name == name)
        .returning(scheduler_offline.c.name)
    ).scalar_one_or_none()
    return removed is not None


def owner_is_live() -> Any:
    """The condition "the schedule's owner is a live registration" (primary key)."""
    return exists().where(and_(schedulers.c.id == schedules.c.owner, live()))


def registration_is_live(reg_id: str) -> Any:
    """The condition "registration `reg_id` holds an unexpired lease" (primary key)."""
    return exists().where(and_(schedulers.c.id == reg_id, live()))
