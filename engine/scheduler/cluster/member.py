"""One scheduler's membership of the schedule cluster (docs/cluster.md).

The Scheduler role calls `step()` from its loop. A step registers (or re-registers after the
lease was lost), renews the lease every TTL/3, asks the assignment strategy to take what this
scheduler may hold (at every wake-up and rescan), raises or resolves the overload alarm, and
fires the due ticks of the schedules it holds (releasing them when it is on the offline list).

Fencing: `may_act` is False once the last successful renewal is older than TTL minus a margin
(a quarter of the TTL), before the lease can expire; the role then neither fires ticks nor
claims steps. Each tick's transaction checks the lease again on the database clock.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sasflow.errors import AssignmentConflictError, InvalidInputError, UnknownWorkflowError
from sasflow.registry import Registry
from sasflow.scheduler.cluster.firing import FireReport, fire_due
from sasflow.scheduler.cluster.limits import Load
from sasflow.scheduler.cluster.strategy import AssignmentStrategy, make_strategy
from sasflow.scheduler.cluster.sync import sync_app_schedules
from sasflow.store.cluster import registrations as schedulers
from sasflow.store.cluster import schedules, shard, versions
from sasflow.store.cluster.registrations import Registration
from sasflow.store.db import Connection, Engine, transaction
from sasflow.store.outbox import alerts

log = logging.getLogger(__name__)

DRAIN_PAUSE = 0.02
"""Seconds between a draining scheduler's release transactions."""

Figures = Callable[[], tuple[int, int, bool]]
"""The role's (steps claimed, replies applied, stopping) recorded with each renewal."""


@dataclass(frozen=True)
class ClusterOptions:
    """A scheduler's place in the schedule cluster (the `sasflow scheduler` options)."""

    name: str | None = None
    """Stable name (the offline list is keyed by it); None: `host:pid` (with a suffix for the
    second and later schedulers of one process). A scheduler given the name of a live one
    waits, unregistered and acting on nothing, until that one's lease expires."""
    address: str | None = None
    """Where to reach it, for operators; None: the host name."""
    fault_tolerance: int = 1
    alarm_threshold: int | None = None
    """M: the overload alarm is raised while it holds more; None: never."""
    lease_ttl: float = 10.0
    assignment: str = "acquire"
    rescan_interval: float | None = None
    """Seconds between scans when nothing woke it (the safety net, and what notices a dead
    scheduler's schedules; SQLite's wake-up). None: a third of the lease TTL, at most 1 s."""
    fire_batch: int = 100
    """Schedules fired per transaction."""
    drain_batch: int = 10
    """Schedules a draining scheduler considers per transaction (every DRAIN_PAUSE)."""

    def __post_init__(self) -> None:
        if self.fault_tolerance < 1:
            raise ValueError("fault_tolerance must be at least 1")
        if self.alarm_threshold is not None and self.alarm_threshold < 0:
            raise ValueError("alarm_threshold must not be negative")
        if self.lease_ttl <= 0:
            raise ValueError("lease_ttl must be positive")


class ClusterMember:
    """This scheduler's registration, fencing clock and schedules."""

    def __init__(
        self,
        engine: Engine,
        registry: Registry,
        options: ClusterOptions,
        *,
        namespace: str,
        actor: str,
        figures: Figures = lambda: (0, 0, False),
    ) -> None:
        self._engine = engine
        self._registry = registry
        self._options = options
        self._namespace = namespace
        self._actor = actor
        self._figures = figures
        self._strategy = make_strategy(options.assignment, namespace=namespace)
        self._rescan = (
            options.rescan_interval
            if options.rescan_interval is not None
            else min(1.0, options.lease_ttl / 3)
        )
        self.name = options.name or f"{socket.gethostname()}:{os.getpid()}"
        self._woken = threading.Event()
        self._reg: Registration | None = None
        self._renewed_at = float("-inf")
        self._next_renew = self._next_scan = self._next_fire = 0.0
        self._offline = False
        self._overloaded: bool | None = None
        self.load: Load | None = None
        self.fired = 0

    # -- what the role asks -------------------------------------------------------------------

    @property
    def registration(self) -> Registration | None:
        return self._reg

    @property
    def strategy(self) -> AssignmentStrategy:
        return self._strategy

    @property
    def may_act(self) -> bool:
        """Registered, and renewed recently enough that the lease cannot have expired."""
        margin = self._options.lease_ttl / 4
        age = time.monotonic() - self._renewed_at
        return self._reg is not None and age < self._options.lease_ttl - margin

    def wake(self) -> None:
        """Scan at the next step (a schedule or the registry changed); any thread may call it."""
        self._woken.set()

    def step(self) -> float:
        """Do what is due (see the module docstring); seconds until the next step is due.
        Raises StoreUnavailableError when the database cannot be reached (the role retries)."""
        t = time.monotonic()
        if t >= self._next_renew:  # registers first when not registered
            self._renew()
        if not self.may_act:
            return max(0.05, self._next_renew - time.monotonic())
        reg = self._reg
        if reg is None:  # may_act says it is registered; this tells mypy
            return self._rescan
        if self._woken.is_set() or t >= self._next_scan:
            self._woken.clear()
            self._scan(reg)
            self._next_scan = t + self._rescan
        if (self._offline and self._strategy.releases_on_drain) or t >= self._next_fire:
            self._fire(reg)
        return max(0.0, min(self._next_renew, self._next_scan, self._next_fire) - time.monotonic())

    def leave(self) -> None:
        """Release every schedule held and remove the registration (on shutdown)."""
        if self._reg is None:
            return
        self._strategy.leave(self._engine)
        with transaction(self._engine) as conn:
            schedulers.deregister(conn, self._reg.id)
            if self._overloaded:
                self._set_alarm(conn, self._reg, over=False, held=0)
            schedules.notify_changed(conn, self._namespace)
        log.info("scheduler %s left the cluster", self.name)
        self._reg = None

    # -- registration and lease ----------------------------------------------------------------

    def _renew(self) -> None:
        started = time.monotonic()
        # Until this attempt succeeds, try again soon (the database may be back any moment).
        self._next_renew = started + min(self._options.lease_ttl / 10, 1.0)
        if self._reg is None:
            self._register(started)
            return
        claimed, applied, stopping = self._figures()
        with transaction(self._engine) as conn:
            renewal = schedulers.renew(
                conn,
                self._reg.id,
                ttl=self._options.lease_ttl,
                held=self.load.held if self.load else 0,
                claimed=claimed,
                applied=applied,
                stopping=stopping,
            )
        if renewal is None:
            log.warning("scheduler %s lost its lease; registering again", self.name)
            self._reg = None
            self._register(started)
            return
        self._renewed_at = started
        self._next_renew = started + self._options.lease_ttl / 3
        if renewal.offline != self._offline:
            self._woken.set()  # the scan logs it and acts on it

    def _register(self, started: float) -> None:
        options = self._options
        reg = Registration(
            id=f"{uuid.uuid4().hex[:12]}:{self.name}"[:100],
            name=self.name,
            address=options.address or socket.gethostname(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            fault_tolerance=options.fault_tolerance,
            alarm_threshold=options.alarm_threshold,
            lease_ttl=options.lease_ttl,
            assignment=options.assignment,
            workflows=tuple((w.name, w.version) for w in self._registry.workflows),
        )
        with transaction(self._engine) as conn:
            # Before anything is recorded: a changed definition under its old version refuses
            # to start (exit status 78), it never advances runs of the other definition.
            versions.record(conn, self._registry.workflows, actor=reg.id)
            others = shard.assignments_live(conn) - {options.assignment}
            if others:
                raise AssignmentConflictError(
                    f"scheduler {self.name} was started with --assignment {options.assignment}"
                    f" but the live schedulers use --assignment {', '.join(sorted(others))}:"
                    " the whole cluster uses one strategy (start it with theirs, or stop them"
                    " all to change it)"
                )
            if not schedulers.register(conn, reg):
                log.warning("scheduler name %r is held by a live registration", reg.name)
                if options.name is None:  # a default name: another scheduler of this process
                    self.name = f"{reg.name}:{reg.id[:4]}"
                    self._next_renew = started  # register under the new name at once
                else:  # wait for the other registration's lease to expire
                    self._next_renew = started + self._options.lease_ttl / 3
                return
            synced = sync_app_schedules(conn, self._registry)
            self._offline = schedulers.offline(conn, self.name)
            schedules.notify_changed(conn, self._namespace)
        self._reg = reg
        self._renewed_at = started
        self._next_renew = started + self._options.lease_ttl / 3
        self._woken.set()
        log.info(
            "scheduler %s registered (%s, n=%d, M=%s, lease %.1fs%s; %d app schedule(s) synced)",
            self.name,
            reg.id,
            reg.fault_tolerance,
            reg.alarm_threshold,
            reg.lease_ttl,
            ", on the offline list" if self._offline else "",
            synced,
        )

    # -- schedules ----------------------------------------------------------------------------

    def _scan(self, reg: Registration) -> None:
        self._strategy.coordinate(self._engine, reg)
        with transaction(self._engine) as conn:
            offline = schedulers.offline(conn, reg.name)
            if offline != self._offline:
                log.info("scheduler %s is %s", self.name, "draining" if offline else "online")
            self._offline = offline
            load = self._strategy.assign(conn, reg, accepting=not offline)
            threshold = reg.alarm_threshold
            if threshold is not None:
                over = load.held > threshold
                if over != self._overloaded:
                    self._set_alarm(conn, reg, over=over, held=load.held)
        if self.load is None or load.held != self.load.held:
            self._next_fire = 0.0  # new schedules may be due now
        self.load = load

    def _set_alarm(self, conn: Connection, reg: Registration, *, over: bool, held: int) -> None:
        alert = alerts.Alert(
            kind=alerts.AlertKind.SCHEDULER_OVERLOADED,
            subject=self.name,
            message=(
                f"scheduler {self.name} holds {held} schedules, more than its alarm threshold "
                f"M={reg.alarm_threshold}: add scheduler capacity"
            ),
            detail={"scheduler": self.name, "held": held, "threshold": reg.alarm_threshold},
        )
        if over:
            alerts.raise_alert(conn, alert)
        else:
            alerts.resolve_open(
                conn, alert.dedup_key, actor=self.name, reason=f"resolved: holds {held}"
            )
        self._overloaded = over

    def _fire(self, reg: Registration) -> None:
        if (
            self._offline and self._strategy.releases_on_drain
        ):  # a few at a time: the operator may stop the drain half-way
            self._fire_batch(reg, self._options.drain_batch, drain_horizon=self._options.lease_ttl)
            self._next_fire = time.monotonic() + DRAIN_PAUSE
            return
        batch = self._options.fire_batch
        # A backlog is fired batch by batch, but never past a renewal: a scheduler busy firing
        # must not let its lease (and with it, the right to fire) lapse.
        while self._fire_batch(reg, batch, drain_horizon=None):
            if time.monotonic() >= self._next_renew or not self.may_act:
                self._next_fire = 0.0
                return
        with transaction(self._engine) as conn:
            due = schedules.next_due(conn, reg.id)
        wait = self._rescan if due is None else due
        self._next_fire = time.monotonic() + min(wait, 60.0)

    def _fire_batch(self, reg: Registration, limit: int, *, drain_horizon: float | None) -> bool:
        """One transaction of fire_due; whether work was left for another. Ticks are submitted
        without a savepoint each; if one cannot be made, the batch is done again with them."""
        try:
            report = self._fire_once(reg, limit, drain_horizon=drain_horizon, isolate=False)
        except (InvalidInputError, UnknownWorkflowError):
            report = self._fire_once(reg, limit, drain_horizon=drain_horizon, isolate=True)
        self.fired += report.fired
        if report.released and self.load is not None:
            held = max(0, self.load.held - report.released)
            self.load = Load(self.load.active, self.load.live, self.load.limit, held)
        return report.more

    def _fire_once(
        self, reg: Registration, limit: int, *, drain_horizon: float | None, isolate: bool
    ) -> FireReport:
        with transaction(self._engine) as conn:
            bounds = self._strategy.fence(conn, reg)
            if bounds is None:  # no plan to follow (resharding): learn the new one first
                self._woken.set()
                return FireReport()
            report = fire_due(
                conn,
                self._registry,
                holder=reg.id,
                fired_by=self.name,
                namespace=self._namespace,
                drain_horizon=drain_horizon,
                limit=limit,
                isolate=isolate,
                bounds=bounds,
            )
            if report.released:
                schedules.notify_changed(conn, self._namespace)
        return report
