"""Assignment strategies: how a scheduler comes to hold schedules.

A strategy is asked, at every scan, to coordinate the cluster (a leader's work, in its own
transactions), to bring this scheduler's holding up to what it may hold and to report its
load; and, first in each firing transaction, which schedule ids it may fire (its fence).
`acquire` takes unowned schedules itself, one locking statement per attempt, up to its limit
N; `scope` (scheduler/cluster/scope.py) follows the plan a leader writes.
"""

from __future__ import annotations

from typing import Protocol

from sasflow.errors import ConfigurationError
from sasflow.scheduler.cluster.limits import Load, hold_limit
from sasflow.scheduler.cluster.scope import ScopeStrategy
from sasflow.store.cluster import registrations as schedulers
from sasflow.store.cluster import schedules
from sasflow.store.cluster.registrations import Registration
from sasflow.store.cluster.shard import Bounds
from sasflow.store.db import Connection, Engine

ASSIGNMENTS = ("acquire", "scope")
"""The names `--assignment` accepts."""


class AssignmentStrategy(Protocol):
    """Decides which schedules this scheduler holds."""

    name: str
    releases_on_drain: bool
    """Whether a draining scheduler releases its schedules itself (else the plan moves them)."""

    def coordinate(self, engine: Engine, me: Registration) -> None:
        """Before each scan, in its own transactions: the cluster-wide work (if any)."""
        ...

    def assign(self, conn: Connection, me: Registration, *, accepting: bool) -> Load:
        """Inside the caller's transaction: take what `me` may take (nothing unless
        `accepting`: a draining scheduler takes nothing) and return its load."""
        ...

    def fence(self, conn: Connection, me: Registration) -> Bounds | None:
        """First in each firing transaction: the schedule ids `me` may fire now (besides
        holding them), or None when it may fire none."""
        ...

    def leave(self, engine: Engine) -> None:
        """On shutdown, before the registration goes: give up cluster-wide roles."""
        ...


class AcquireStrategy:
    """Each scheduler acquires unowned schedules while it holds fewer than its limit N."""

    name = "acquire"
    releases_on_drain = True

    def coordinate(self, engine: Engine, me: Registration) -> None:
        """Nothing: each scheduler acquires for itself."""

    def fence(self, conn: Connection, me: Registration) -> Bounds | None:  # noqa: ARG002
        """Every schedule it holds (the lease check of each firing is enough)."""
        return Bounds()

    def leave(self, engine: Engine) -> None:
        """Nothing to give up."""

    def assign(self, conn: Connection, me: Registration, *, accepting: bool) -> Load:
        active = schedules.count_active(conn)
        live = schedulers.count_live(conn)
        limit = hold_limit(active, live, me.fault_tolerance)
        held = schedules.count_held(conn, me.id)
        if accepting and held < limit:
            held += len(schedules.acquire(conn, me.id, limit=limit - held))
        return Load(active=active, live=live, limit=limit, held=held)


def make_strategy(name: str, *, namespace: str) -> AssignmentStrategy:
    """The strategy called `name` (one of ASSIGNMENTS), for the schedulers of `namespace`."""
    if name == AcquireStrategy.name:
        return AcquireStrategy()
    if name == ScopeStrategy.name:
        return ScopeStrategy(namespace=namespace)
    raise ConfigurationError(
        f"unknown assignment strategy {name!r} (one of: {', '.join(ASSIGNMENTS)})"
    )
