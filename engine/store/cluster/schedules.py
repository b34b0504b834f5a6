"""The `schedules` and `schedule_ticks` tables: definitions, ownership (acquire, release) and
the ticks fired (docs/schedules.md, docs/cluster.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    Connection,
    Row,
    bindparam,
    case,
    delete,
    func,
    null,
    select,
    update,
)

from sasflow.store.cluster.registrations import owner_is_live, registration_is_live
from sasflow.store.cluster.shard import Bounds
from sasflow.store.dialect import has_notifications, upsert_insert
from sasflow.store.schema import schedule_ticks, schedulers, schedules
from sasflow.store.sqltime import now


def channel(namespace: str) -> str:
    """The notification channel that wakes schedulers on schedule and registry changes."""
    return f"sasflow:{namespace}:schedules"


def notify_changed(conn: Connection, namespace: str) -> None:
    """Wake every scheduler of the namespace at commit (nothing on SQLite: they rescan)."""
    if has_notifications(conn):
        conn.execute(select(func.pg_notify(channel(namespace), "")))


# -- definitions ------------------------------------------------------------------------------


def insert_schedule(conn: Connection, values: dict[str, Any]) -> dict[str, Any] | None:
    """Add a schedule; None when the name is taken (uq_schedules_name)."""
    row = conn.execute(
        upsert_insert(conn, schedules)
        .values(**values)
        .on_conflict_do_nothing(index_elements=[schedules.c.name])
        .returning(*schedules.c)
    ).first()
    return None if row is None else dict(row._mapping)


def update_definition(conn: Connection, schedule_id: int, values: dict[str, Any]) -> None:
    """Replace a schedule's definition columns (primary key)."""
    conn.execute(
        update(schedules).where(schedules.c.id == schedule_id).values(**values, updated_at=now())
    )


def by_name(conn: Connection, name: str, *, lock: bool = False) -> dict[str, Any] | None:
    """Every column of the schedule called `name` (uq_schedules_name)."""
    query = select(schedules).where(schedules.c.name == name)
    row = conn.execute(query.with_for_update() if lock else query).first()
    return None if row is None else dict(row._mapping)


def by_id(conn: Connection, schedule_id: int, *, lock: bool = False) -> dict[str, Any] | None:
    """Every column of one schedule (primary key)."""
    query = select(schedules).where(schedules.c.id == schedule_id)
    row = conn.execute(query.with_for_update() if lock else query).first()
    return None if row is None else dict(row._mapping)


def all_schedules(conn: Connection) -> list[dict[str, Any]]:
    """Every schedule with its owner's name and whether that owner is live, by id (a scan of
    schedules; owners by primary key)."""
    rows = conn.execute(
        select(
            schedules,
            schedulers.c.name.label("owner_name"),
            (schedulers.c.lease_expires_at > now()).label("owner_live"),
        )
        .select_from(schedules.outerjoin(schedulers, schedulers.c.id == schedules.c.owner))
        .order_by(schedules.c.id)
    )
    return [dict(r._mapping) for r in rows]


def set_paused(conn: Connection, schedule_id: int, *, paused: bool, next_tick_at: datetime) -> None:
    """Pause (and release) or resume a schedule (primary key)."""
    conn.execute(
        update(schedules)
        .where(schedules.c.id == schedule_id)
        .values(paused=paused, owner=None, next_tick_at=next_tick_at, updated_at=now())
    )


def delete_schedule(conn: Connection, schedule_id: int) -> None:
    """Remove a schedule and its tick history (primary key; the ticks by cascade)."""
    conn.execute(delete(schedules).where(schedules.c.id == schedule_id))


def release(conn: Connection, schedule_id: int, *, owner: str | None = None) -> bool:
    """Free a schedule (of `owner` only, when given) for any scheduler to acquire; False when
    it was not held (by `owner`) (primary key)."""
    query = update(schedules).where(schedules.c.id == schedule_id, schedules.c.owner.is_not(None))
    if owner is not None:
        query = query.where(schedules.c.owner == owner)
    freed = conn.execute(query.values(owner=None).returning(schedules.c.id)).first()
    return freed is not None


# -- ownership --------------------------------------------------------------------------------


def count_active(conn: Connection) -> int:
    """K: schedules not paused (a scan of schedules)."""
    return int(conn.execute(select(func.count()).where(schedules.c.paused.is_(False))).scalar_one())


def count_held(conn: Connection, reg_id: str) -> int:
    """X: schedules held by registration `reg_id` (ix_schedules_owner_next_tick_at)."""
    return int(conn.execute(select(func.count()).where(schedules.c.owner == reg_id)).scalar_one())


def acquire(conn: Connection, reg_id: str, *, limit: int) -> list[int]:
    """Take up to `limit` unowned active schedules (no owner, or a dead one) for `reg_id`, whose
    own lease must be live: one locking statement, skipping rows others hold (a scan of
    schedules; the owners' leases by primary key)."""
    free = (
        select(schedules.c.id)
        .where(
            schedules.c.paused.is_(False),
            schedules.c.owner.is_(None) | ~owner_is_live(),
        )
        .order_by(schedules.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("free")
    )
    rows = conn.execute(
        update(schedules)
        .where(schedules.c.id == free.c.id, registration_is_live(reg_id))
        .values(owner=reg_id, acquired_at=now())
        .returning(schedules.c.id)
    )
    return [r.id for r in rows]


def lock_owned(
    conn: Connection, reg_id: str, *, due_only: bool, limit: int, bounds: Bounds | None = None
) -> tuple[Sequence[Row[Any]], datetime | None]:
    """The schedules `reg_id` holds (those due, when `due_only`; those within `bounds`, when
    given), locked until commit, provided its lease is still live (the fence of every tick),
    and the database time (ix_schedules_owner_next_tick_at)."""
    query = (
        select(schedules, now().label("db_now"))
        .where(schedules.c.owner == reg_id, registration_is_live(reg_id))
        .order_by(schedules.c.next_tick_at)
        .limit(limit)
        .with_for_update(of=schedules)
    )
    if due_only:
        query = query.where(schedules.c.next_tick_at <= now())
    if bounds is not None and bounds.lo is not None:
        query = query.where(schedules.c.id >= bounds.lo)
    if bounds is not None and bounds.hi is not None:
        query = query.where(schedules.c.id <= bounds.hi)
    rows = conn.execute(query).all()
    return rows, (rows[0].db_now if rows else None)


def next_due(conn: Connection, reg_id: str) -> float | None:
    """Seconds until the earliest tick of the schedules `reg_id` holds, or None when it holds
    none (ix_schedules_owner_next_tick_at)."""
    row = conn.execute(
        select(func.min(schedules.c.next_tick_at), now()).where(schedules.c.owner == reg_id)
    ).one()
    earliest, db_now = row
    if earliest is None:
        return None
    return max(0.0, float((earliest - db_now).total_seconds()))


@dataclass(frozen=True)
class Ticked:
    """Where a fired (or released) schedule goes next."""

    schedule_id: int
    next_tick_at: datetime
    last_tick_at: datetime | None
    release: bool


def set_ticked(conn: Connection, moves: Sequence[Ticked]) -> None:
    """Move schedules to their next tick after firing, releasing those marked (primary key;
    one executemany)."""
    if not moves:
        return
    statement = (
        update(schedules)
        .where(schedules.c.id == bindparam("b_id"))
        .values(
            next_tick_at=bindparam("b_next", type_=schedules.c.next_tick_at.type),
            last_tick_at=func.coalesce(
                bindparam("b_last", type_=schedules.c.last_tick_at.type), schedules.c.last_tick_at
            ),
            owner=case((bindparam("b_release", type_=Boolean()), null()), else_=schedules.c.owner),
        )
    )
    conn.execute(
        statement,
        [
            {
                "b_id": m.schedule_id,
                "b_next": m.next_tick_at,
                "b_last": m.last_tick_at,
                "b_release": m.release,
            }
            for m in moves
        ],
    )


# -- ticks ------------------------------------------------------------------------------------


def record_ticks(conn: Connection, ticks: Sequence[dict[str, Any]]) -> None:
    """Record fired ticks (schedule_id, tick_at, run_id, fired_by, error), skipping those
    recorded already, in one statement (uq_schedule_ticks_schedule_id_tick_at)."""
    if ticks:
        conn.execute(
            upsert_insert(conn, schedule_ticks)
            .values(list(ticks))
            .on_conflict_do_nothing(
                index_elements=[schedule_ticks.c.schedule_id, schedule_ticks.c.tick_at]
            )
        )


def recent_ticks(conn: Connection, schedule_id: int, *, limit: int) -> list[dict[str, Any]]:
    """The latest `limit` ticks of a schedule, newest first (uq_schedule_ticks_...)."""
    rows = conn.execute(
        select(schedule_ticks)
        .where(schedule_ticks.c.schedule_id == schedule_id)
        .order_by(schedule_ticks.c.tick_at.desc())
        .limit(limit)
    )
    return [dict(r._mapping) for r in rows]
