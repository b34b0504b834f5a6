"""Assignment strategies: how a scheduler comes to hold schedules.

A strategy is asked, at every scan, to bring this scheduler's holding up to what it may hold
and to report its load. `acquire` (issue 12) takes unowned schedules itself, one locking
statement per attempt, up to its limit N. Another strategy (a leader writing a plan) plugs in
behind the same interface (`make_strategy`).
"""

from __future__ import annotations

from typing import Protocol

from sasflow.cluster.limits import Load, hold_limit
from sasflow.errors import ConfigurationError
from sasflow.store import schedulers, schedules
from sasflow.store.db import Connection
from sasflow.store.schedulers import Registration

ASSIGNMENTS = ("acquire",)
"""The names `--assignment` accepts."""


class AssignmentStrategy(Protocol):
    """Decides which schedules this scheduler holds."""

    name: str

    def assign(self, conn: Connection, me: Registration, *, accepting: bool) -> Load:
        """Inside the caller's transaction: take what `me` may take (nothing unless
        `accepting`: a draining scheduler takes nothing) and return its load."""
        ...


class AcquireStrategy:
    """Each scheduler acquires unowned schedules while it holds fewer than its limit N."""

    name = "acquire"

    def assign(self, conn: Connection, me: Registration, *, accepting: bool) -> Load:
        active = schedules.count_active(conn)
        live = schedulers.count_live(conn)
        limit = hold_limit(active, live, me.fault_tolerance)
        held = schedules.count_held(conn, me.id)
        if accepting and held < limit:
            held += len(schedules.acquire(conn, me.id, limit=limit - held))
        return Load(active=active, live=live, limit=limit, held=held)


def make_strategy(name: str) -> AssignmentStrategy:
    """The strategy called `name` (one of ASSIGNMENTS)."""
    if name == AcquireStrategy.name:
        return AcquireStrategy()
    raise ConfigurationError(
        f"unknown assignment strategy {name!r} (one of: {', '.join(ASSIGNMENTS)})"
    )
