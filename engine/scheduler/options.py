"""The tuning of one scheduler process (the `sasflow scheduler` options)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sasflow.messages import DEFAULT_LIMITS, Limits
from sasflow.scheduler.advancing import AdvanceOptions
from sasflow.scheduler.cluster.member import ClusterOptions
from sasflow.store.runs import pools


@dataclass(frozen=True)
class SchedulerOptions:
    """Tuning of one scheduler process."""

    claim_batch: int = 100
    reply_prefetch: int = 500
    max_in_flight: int | None = 1000
    """Steps of one agent this scheduler keeps in flight (dispatched, no reply applied) before
    it leaves that agent out of its claims; None: no bound (engine/scheduler/inflight.py)."""
    rescan_interval: float | None = None
    """Seconds between claims when nothing woke us: the safety net for missed notifications on
    PostgreSQL, the wake-up itself on SQLite. None: the database's default (1 s; 0.05 s on
    SQLite, see store.dialect)."""
    relay_interval: float = 1.0
    fleet_interval: float = 1.0
    """Seconds between two takes of agent heartbeats (sasflow.scheduler.fleet)."""
    fleet_bound: bool = True
    """Claim none of the steps of an agent whose instances are all gone (stopped or lost), and
    with `fleet_bound_factor` bound the others (docs/flow-control.md)."""
    fleet_bound_factor: float | None = None
    """Keep each agent's steps in flight, cluster-wide, within this many per unit of its live
    instances' capacity (summed concurrency); None: no such bound."""
    pool_limits: pools.PoolLimits = field(default_factory=pools.PoolLimits)
    """When a step stops waiting for an agent of its pool (recheck_s: the rescan interval)."""
    limits: Limits = DEFAULT_LIMITS
    """Largest and deepest reply accepted; a reply beyond them is dead-lettered with the limit
    in the reason (agents check their own replies first, see docs/protocol.md, section 3)."""
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    """Its registration, lease and schedules (docs/cluster.md)."""
    advance: AdvanceOptions = field(default_factory=AdvanceOptions)
    """The advance duty: user code off the loop (its pool and time budget), runs left by a
    scheduler without their version, the `version_missing` alert (scheduler.advancing)."""
