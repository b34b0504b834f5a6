"""The `scope` assignment strategy: range sharding with a leader (docs/cluster.md).

- **Leader**: at each scan every scheduler competes for the `shard-leader` lease
  (store/cluster/lease.py: database clock, fencing token; TTL = its registration's lease
  TTL). The holder renews it at each scan (at least every second), so another takes over
  within TTL + 1 s of its death.
- **Resharding**: the leader computes the plan from the rows (live schedulers not on the
  offline list, by address; active schedules by id) and compares it with the published one.
  When they differ (a scheduler joined, left or died; a schedule was added, removed, paused
  or resumed) it publishes a new epoch with no plan (one transaction: nobody fires from its
  commit on), then writes the epoch's ranges, hands each range's schedules to its scheduler
  and marks the plan ready (a second transaction). Both check the leader's lease token.
- **Firing**: a scheduler fires only the schedules it holds within its range (by its name) of
  the epoch it saw, and only while that epoch is the current, ready one: checked first in each
  firing transaction, which locks the plan row FOR SHARE (store/shard.fence), so a scheduler
  paused through a reshard finds its epoch stale and fires nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sasflow.errors import LeaseLostError
from sasflow.scheduler.cluster.limits import Load
from sasflow.scheduler.cluster.plan import EvenRanges, Member, PlannedRange, Planner
from sasflow.store.cluster import registrations as schedulers
from sasflow.store.cluster import schedules, shard
from sasflow.store.cluster.lease import Lease
from sasflow.store.cluster.registrations import Registration
from sasflow.store.cluster.shard import Bounds
from sasflow.store.db import Connection, Engine, transaction

log = logging.getLogger(__name__)

LEASE = "shard-leader"
"""The leader's lease (a row of `leases`)."""


def plan_rows(planned: Sequence[PlannedRange]) -> list[dict[str, Any]]:
    """A plan as `shard_ranges` rows (without the epoch)."""
    return [
        {
            "scheduler_id": r.member.id,
            "position": r.position,
            "name": r.member.name,
            "address": r.member.address,
            "first": r.first,
            "last": r.last,
            "lo_id": r.lo_id,
            "hi_id": r.hi_id,
        }
        for r in planned
    ]


class ScopeStrategy:
    """Follow the plan the shard leader writes; lead when holding its lease."""

    name = "scope"
    releases_on_drain = False

    def __init__(self, *, namespace: str, planner: Planner | None = None) -> None:
        self._namespace = namespace
        """Whose schedulers a reshard wakes."""
        self._planner: Planner = planner or EvenRanges()
        self._lease: Lease | None = None
        self.epoch: int | None = None
        """The plan epoch this scheduler follows (None: resharding, or no plan yet)."""
        self.bounds: Bounds | None = None
        """Its range in that epoch (None: it has none, and fires nothing)."""

    # -- leading --------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self._lease is not None and self._lease.token is not None

    def coordinate(self, engine: Engine, me: Registration) -> None:
        """Hold (or try to take) the leader lease; when held, reshard if the plan is stale."""
        if self._lease is None or self._lease.holder != me.id:
            self._lease = Lease(me.id, name=LEASE, ttl=me.lease_ttl)
        was_leading = self.leading
        if not self._lease.acquire(engine):
            return
        if not was_leading:
            log.info("scheduler %s leads the shard plan (token %s)", me.name, self._lease.token)
        try:
            self._reshard_if_stale(engine, me, self._lease)
        except LeaseLostError as exc:
            log.warning("scheduler %s: %s; not resharding", me.name, exc)

    def _reshard_if_stale(self, engine: Engine, me: Registration, lease: Lease) -> None:
        with transaction(engine) as conn:
            lease.check(conn)
            _, rows = self._desired(conn)
            state = shard.plan_state(conn)
            if state is not None and state["ready"]:
                published = shard.plan_ranges(conn, state["epoch"])
                if [_key(r) for r in published] == [_key(r) for r in rows]:
                    return
            epoch = shard.publish_resharding(
                conn, leader=me.id, leader_name=me.name, token=lease.token or 0
            )
            schedules.notify_changed(conn, self._namespace)
        # Every scheduler fires nothing from here on (fence: the epoch is not ready).
        with transaction(engine) as conn:
            lease.check(conn)
            planned, rows = self._desired(conn)
            active = planned[-1].last if planned else len(shard.active_ids(conn))
            if not shard.write_plan(conn, epoch, rows, active=active, live=len(planned)):
                return
            for r in planned:
                shard.hand_over(conn, r.member.id, Bounds(r.lo_id, r.hi_id))
            schedules.notify_changed(conn, self._namespace)
        log.info(
            "scheduler %s resharded: epoch %d, K=%d over S=%d (%s)",
            me.name,
            epoch,
            active,
            len(planned),
            ", ".join(f"{r.member.name} {r.first}-{r.last}" for r in planned),
        )

    def _desired(self, conn: Connection) -> tuple[list[PlannedRange], list[dict[str, Any]]]:
        members = [Member(m["id"], m["name"], m["address"]) for m in shard.plan_members(conn)]
        planned = self._planner.plan(shard.active_ids(conn), members)
        return planned, plan_rows(planned)

    def leave(self, engine: Engine) -> None:
        if self._lease is not None:
            self._lease.release(engine)

    # -- following ------------------------------------------------------------------------------

    def assign(self, conn: Connection, me: Registration, *, accepting: bool) -> Load:
        """Follow the current plan: learn the epoch and this scheduler's range, and take the
        schedules of its range it does not hold (added, resumed or released since the plan)."""
        state = shard.plan_state(conn)
        self.epoch, self.bounds = None, None
        limit = 0
        if state is not None and state["ready"]:
            self.epoch = int(state["epoch"])
            self.bounds = shard.fence(conn, self.epoch, me.name)
            mine = shard.range_of(conn, self.epoch, me.name)
            limit = 0 if mine is None else max(0, mine["last"] - mine["first"] + 1)
            if self.bounds is not None and accepting:
                shard.hand_over(conn, me.id, self.bounds)
        return Load(
            active=schedules.count_active(conn),
            live=schedulers.count_live(conn),
            limit=limit,
            held=schedules.count_held(conn, me.id),
        )

    def fence(self, conn: Connection, me: Registration) -> Bounds | None:
        if self.epoch is None or self.bounds is None:
            return None
        bounds = shard.fence(conn, self.epoch, me.name)
        if bounds is None:  # a reshard began: follow the new plan at the next scan
            self.epoch, self.bounds = None, None
        return bounds


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two plans the same: names, not registrations (a scheduler that registers
    again under its name, after a lapsed lease, keeps its range and takes its schedules back
    itself, without a reshard)."""
    return (row["name"], row["address"], row["first"], row["last"], row["lo_id"], row["hi_id"])
