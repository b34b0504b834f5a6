"""The scope strategy's plan in the database (docs/cluster.md): the `shard_plan` row (epoch,
ready, leader) and the epoch's `shard_ranges`, written by the shard-leader lease's holder and
read (the fence of every tick) by each scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, case, delete, insert, select, update

from sasflow.store.cluster.registrations import live
from sasflow.store.dialect import upsert_insert
from sasflow.store.schema import scheduler_offline, schedulers, schedules, shard_plan, shard_ranges
from sasflow.store.sqltime import now

PLAN = "scope"
"""The plan row's name."""


@dataclass(frozen=True)
class Bounds:
    """The schedule ids a scheduler may fire (None: unbounded)."""

    lo: int | None = None
    hi: int | None = None


def plan_state(conn: Connection) -> dict[str, Any] | None:
    """The plan row (epoch, ready, leader, K, S), or None before the first plan (primary
    key)."""
    row = conn.execute(select(shard_plan).where(shard_plan.c.name == PLAN)).first()
    return None if row is None else dict(row._mapping)


def plan_ranges(conn: Connection, epoch: int) -> list[dict[str, Any]]:
    """The ranges of plan `epoch`, by position (pk_shard_ranges)."""
    rows = conn.execute(
        select(shard_ranges).where(shard_ranges.c.epoch == epoch).order_by(shard_ranges.c.position)
    )
    return [dict(r._mapping) for r in rows]


def range_of(conn: Connection, epoch: int, name: str) -> dict[str, Any] | None:
    """Scheduler `name`'s range in plan `epoch` (pk_shard_ranges)."""
    row = conn.execute(
        select(shard_ranges).where(shard_ranges.c.epoch == epoch, shard_ranges.c.name == name)
    ).first()
    return None if row is None else dict(row._mapping)


def fence(conn: Connection, epoch: int, name: str) -> Bounds | None:
    """The first statement of a firing transaction: the ids scheduler `name` may fire,
    provided plan `epoch` is the current one and ready, else None. The plan row is locked FOR
    SHARE until commit, so a reshard (which updates it) waits for the firings in progress, and
    none starts on the old plan after it (primary keys)."""
    row = conn.execute(
        select(shard_ranges.c.lo_id, shard_ranges.c.hi_id)
        .select_from(
            shard_plan.join(
                shard_ranges,
                and_(
                    shard_ranges.c.epoch == shard_plan.c.epoch,
                    shard_ranges.c.name == name,
                ),
            )
        )
        .where(shard_plan.c.name == PLAN, shard_plan.c.epoch == epoch, shard_plan.c.ready)
        .with_for_update(read=True, of=shard_plan)
    ).first()
    return None if row is None else Bounds(row.lo_id, row.hi_id)


def plan_members(conn: Connection) -> list[dict[str, Any]]:
    """The schedulers a plan covers: live and not on the offline list, by address (then name
    and id, to be deterministic when addresses repeat) (ix_schedulers_lease_expires_at)."""
    offline = select(scheduler_offline.c.name).where(scheduler_offline.c.name == schedulers.c.name)
    rows = conn.execute(
        select(schedulers.c.id, schedulers.c.name, schedulers.c.address)
        .where(live(), ~offline.exists())
        .order_by(schedulers.c.address, schedulers.c.name, schedulers.c.id)
    )
    return [dict(r._mapping) for r in rows]


def active_ids(conn: Connection) -> list[int]:
    """The ids of the active (not paused) schedules, ascending (primary key)."""
    rows = conn.execute(
        select(schedules.c.id).where(schedules.c.paused.is_(False)).order_by(schedules.c.id)
    )
    return [int(r.id) for r in rows]


def publish_resharding(conn: Connection, *, leader: str, leader_name: str, token: int) -> int:
    """Start a new plan epoch with no plan ("resharding": nobody fires); the new epoch
    (primary key)."""
    statement = upsert_insert(conn, shard_plan).values(
        name=PLAN, epoch=1, ready=False, leader=leader, leader_name=leader_name, token=token
    )
    return int(
        conn.execute(
            statement.on_conflict_do_update(
                index_elements=[shard_plan.c.name],
                set_={
                    "epoch": shard_plan.c.epoch + 1,
                    "ready": False,
                    "leader": leader,
                    "leader_name": leader_name,
                    "token": token,
                    "changed_at": now(),
                },
            ).returning(shard_plan.c.epoch)
        ).scalar_one()
    )


def write_plan(
    conn: Connection, epoch: int, ranges: Sequence[dict[str, Any]], *, active: int, live: int
) -> bool:
    """Write plan `epoch`'s ranges and mark it ready, dropping older epochs' ranges; False when
    `epoch` is no longer the current one (primary keys)."""
    ready = conn.execute(
        update(shard_plan)
        .where(shard_plan.c.name == PLAN, shard_plan.c.epoch == epoch)
        .values(ready=True, active=active, live=live, changed_at=now())
        .returning(shard_plan.c.epoch)
    ).first()
    if ready is None:
        return False
    conn.execute(delete(shard_ranges).where(shard_ranges.c.epoch != epoch))
    if ranges:
        conn.execute(insert(shard_ranges), [{**r, "epoch": epoch} for r in ranges])
    return True


def hand_over(conn: Connection, reg_id: str, bounds: Bounds) -> int:
    """Make `reg_id` the owner of the active schedules within `bounds` it does not hold yet;
    how many. A schedule taken from a live owner keeps every pending tick (acquired_at at
    its next tick: a reshard is no failure); one that had no live owner gets the catch-up
    policy (acquired_at now) (a scan of schedules in the id range, by primary key)."""
    previous_live = (
        select(schedulers.c.id).where(schedulers.c.id == schedules.c.owner, live()).exists()
    )
    query = update(schedules).where(
        schedules.c.paused.is_(False),
        schedules.c.owner.is_(None) | (schedules.c.owner != reg_id),
    )
    if bounds.lo is not None:
        query = query.where(schedules.c.id >= bounds.lo)
    if bounds.hi is not None:
        query = query.where(schedules.c.id <= bounds.hi)
    taken = conn.execute(
        query.values(
            owner=reg_id,
            acquired_at=case(
                (previous_live & (schedules.c.next_tick_at < now()), schedules.c.next_tick_at),
                else_=now(),
            ),
        ).returning(schedules.c.id)
    )
    return len(taken.all())


def assignments_live(conn: Connection) -> set[str]:
    """The assignment strategies the live schedulers run (ix_schedulers_lease_expires_at)."""
    rows = conn.execute(select(schedulers.c.assignment).where(live()).distinct())
    return {r.assignment for r in rows}
