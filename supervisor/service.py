"""The supervisor role: a daemon (`--interval`) or one bounded sweep (`--once`, for cron)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sasflow.errors import (
    BrokerUnavailableError,
    LeaseLostError,
    SchemaOutdatedError,
    StoreUnavailableError,
)
from sasflow.hooks import Hooks, guarded
from sasflow.ops.incidents import prune_closed as prune_closed_incidents
from sasflow.ops.retention import (
    GrowthRetention,
    PruneOptions,
    RetentionPolicy,
    prune,
    prune_audit,
)
from sasflow.runtime import process_id
from sasflow.schema_watch import SchemaWatch
from sasflow.store.cluster.lease import SUPERVISOR_LEASE, Lease
from sasflow.store.db import Engine
from sasflow.store.runs.sweeps import SweepReport
from sasflow.supervisor.dead_letters import DeadLetterRetention
from sasflow.supervisor.deadlines import sweep_deadlines
from sasflow.supervisor.fleet import (
    flag_lost_agents,
    flag_missing_actions,
    flag_wedged_agents,
)
from sasflow.supervisor.outage import DEFAULT_OUTAGE_AFTER_S, OutageWatch
from sasflow.supervisor.subscribers import SubscriberWatch, watch_subscribers
from sasflow.supervisor.sweep import (
    count_dead_requests,
    flag_stalled,
    sweep_expired,
)
from sasflow.transport.base import Delivery, Transport
from sasflow.transport.topology import Names, declare_agent_queue, declare_common

log = logging.getLogger(__name__)

DEAD_REQUESTS_PER_SWEEP = 1000


class Dispatcher(Protocol):
    """Delivers raised alerts to the sinks (see sasflow.supervisor.dispatch)."""

    def start(self) -> None: ...

    def wake(self) -> None: ...

    def stop(self) -> None: ...

    def dispatch_pending(self, budget_s: float) -> int: ...


@dataclass(frozen=True)
class SupervisorOptions:
    """Tuning of one supervisor process."""

    interval: float = 5.0
    """Seconds between sweeps of the daemon."""
    batch: int = 500
    """Expired steps counted per transaction."""
    budget: float = 30.0
    """Seconds one sweep may take; what is left is swept next time."""
    stalled_after: float = 300.0
    """Seconds a ready step may stay unclaimed before a `stalled` alert."""
    outage_after: float = DEFAULT_OUTAGE_AFTER_S
    """Seconds an agent may have work waiting and nobody serving it before an `agent_outage`
    alert (supervisor.outage)."""
    lease_ttl: float | None = None
    """Seconds the leader's lease lasts without renewal [default: max(3 x interval, 15)]."""
    retention: RetentionPolicy | None = None
    """How long finished runs are kept (None: forever; the CLI passes the settings' policy)."""
    growth: GrowthRetention = field(default_factory=GrowthRetention)
    """How long audit records, away stream subscribers and dead letters are kept (default:
    forever; the CLI passes the settings')."""
    prune_interval: float = 300.0
    """Seconds between two retention passes (the first sweep makes one)."""
    prune_batch: int = 200
    """Finished runs deleted per transaction."""
    prune_budget: float = 5.0
    """Seconds each part of a retention pass (runs, audit records, expired subscribers'
    updates) may take; what is left waits for the next pass."""

    @property
    def ttl(self) -> float:
        return self.lease_ttl if self.lease_ttl is not None else max(3 * self.interval, 15.0)


class Supervisor:
    """Sweeps while it holds the supervisor lease; any number may run, one acts."""

    def __init__(
        self,
        engine: Engine,
        names: Names,
        *,
        transport: Transport | None = None,
        dispatcher: Dispatcher | None = None,
        options: SupervisorOptions | None = None,
        stop: threading.Event | None = None,
        hooks: Hooks | None = None,
        schema: SchemaWatch | None = None,
    ) -> None:
        self.id = process_id("supervisor")
        self.schema = schema or SchemaWatch(engine, self.id)
        """Says once that the schema is not at head (share it with the alert dispatcher)."""
        self._hooks = guarded(hooks)
        self._engine = engine
        self._names = names
        self._transport = transport
        self._dispatcher = dispatcher
        self._options = options or SupervisorOptions()
        self._stop = stop or threading.Event()
        self.lease = Lease(self.id, name=SUPERVISOR_LEASE, ttl=self._options.ttl)
        self._broker_ready = False
        self._declared: set[str] = set()
        self._outages = OutageWatch(after_s=self._options.outage_after)
        self._pruned_at: float | None = None
        growth = self._options.growth
        self._dead_letters = (
            DeadLetterRetention(growth.dead_letters_keep_s, growth.dead_letters_max)
            if growth.dead_letters_keep_s is not None or growth.dead_letters_max is not None
            else None
        )

    @property
    def stop_event(self) -> threading.Event:
        return self._stop

    def sweep_once(self) -> SweepReport | None:
        """One sweep if this process is (or becomes) the leader; None when another one is.

        Raises StoreUnavailableError when the database cannot be reached."""
        if not self.lease.acquire(self._engine):
            self._hooks.sweep_finished(None)
            return None
        started = time.monotonic()
        report = SweepReport()
        options = self._options
        try:
            self._batched(sweep_expired, report)
            self._count_dead_requests(report)
            self._batched(sweep_deadlines, report)
            flag_stalled(
                self._engine,
                self.lease,
                stalled_after=options.stalled_after,
                actor=self.id,
                report=report,
            )
            flag_lost_agents(
                self._engine,
                self.lease,
                actor=self.id,
                namespace=self._names.namespace,
                report=report,
            )
            flag_wedged_agents(self._engine, self.lease, actor=self.id, report=report)
            flag_missing_actions(
                self._engine,
                self.lease,
                actor=self.id,
                after_s=options.outage_after,
                report=report,
            )
            self._outages.check(
                self._engine,
                self.lease,
                self._consumer_counts,
                actor=self.id,
                queue_of=self._names.agent,
                report=report,
            )
            self._enforce_retention(report)
        except LeaseLostError as exc:
            log.warning("%s", exc)
            report.complete = False
        report.seconds = time.monotonic() - started
        if report.alerts and self._dispatcher is not None:
            self._dispatcher.wake()
        self._hooks.sweep_finished(report)
        return report

    def _enforce_retention(self, report: SweepReport) -> None:
        """Every `prune_interval`: delete finished runs past their retention (a small batch
        per transaction that skips locked runs, so the claim, the apply and the sweep never
        wait for it), then old audit records, then alert and expire away subscribers, then
        remove old dead letters (docs/operations.md#retention)."""
        options = self._options
        started = time.monotonic()
        if self._pruned_at is not None and started - self._pruned_at < options.prune_interval:
            return
        self._pruned_at = started
        complete = True
        if options.retention is not None and options.retention.rules:
            done = prune(
                self._engine,
                options.retention,
                actor=self.id,
                reason="retention",
                options=PruneOptions(batch=options.prune_batch, budget=options.prune_budget),
                check=self.lease.check,
                collect_ids=False,
            )
            report.pruned += done.pruned
            report.inbound_pruned += done.inbound_pruned
            complete = done.complete
        growth = options.growth
        if growth.audit_keep_s is not None:
            audited = prune_audit(
                self._engine,
                growth.audit_keep_s,
                actor=self.id,
                budget=options.prune_budget,
                check=self.lease.check,
            )
            report.audit_pruned += audited.pruned
            complete = complete and audited.complete
            # Closed incidents are an operator's record, like the audit trail: kept as long.
            _, incidents_done = prune_closed_incidents(
                self._engine,
                growth.audit_keep_s,
                actor=self.id,
                budget=options.prune_budget,
                check=self.lease.check,
            )
            complete = complete and incidents_done
        if growth.subscriber_alert_s is not None:
            watch = SubscriberWatch(
                growth.subscriber_alert_s, growth.subscriber_expire_s, options.prune_budget
            )
            watch_subscribers(self._engine, self.lease, watch, actor=self.id, report=report)
        self._expire_dead_letters(report)
        if not complete:
            self._pruned_at = None  # more to do: the next sweep goes on

    def _expire_dead_letters(self, report: SweepReport) -> None:
        if self._dead_letters is None or self._transport is None:
            return
        try:
            self._connect_broker(self._transport)
            self._dead_letters.run(
                self._engine,
                self.lease,
                self._transport,
                self._names,
                actor=self.id,
                report=report,
            )
        except BrokerUnavailableError as exc:
            self._broker_ready = False
            log.warning("%s: dead letters not looked at: %s", self.id, exc)

    def _connect_broker(self, transport: Transport) -> None:
        if not self._broker_ready:
            transport.connect()
            declare_common(transport, self._names)
            self._declared.clear()
            self._broker_ready = True

    def _consumer_counts(self, agents: list[str]) -> dict[str, int] | None:
        """Consumers of each agent's shared queue (declared first: a queue nobody declared yet
        has none); None without a broker; BrokerUnavailableError when it cannot be reached."""
        if self._transport is None:
            return None
        try:
            self._connect_broker(self._transport)
            counts = {}
            for agent in agents:
                if agent not in self._declared:
                    declare_agent_queue(self._transport, self._names, agent)
                    self._declared.add(agent)
                counts[agent] = self._transport.consumer_count(self._names.agent(agent))
        except BrokerUnavailableError as exc:
            self._broker_ready = False
            log.warning("%s: agents' consumers not counted: %s", self.id, exc)
            raise
        return counts

    def _batched(self, sweep: Callable[..., None], report: SweepReport) -> None:
        """Run one of the sweeps that work `batch` rows per transaction within `budget`
        (expired steps, run deadlines), as this supervisor, fenced by its lease."""
        sweep(
            self._engine,
            self.lease,
            batch=self._options.batch,
            budget=self._options.budget,
            actor=self.id,
            report=report,
            namespace=self._names.namespace,
            hooks=self._hooks,
        )

    def _count_dead_requests(self, report: SweepReport) -> None:
        if self._transport is None:
            return
        try:
            self._connect_broker(self._transport)
            taken: list[Delivery] = []
            while len(taken) < DEAD_REQUESTS_PER_SWEEP:
                delivery = self._transport.get(self._names.dead_requests)
                if delivery is None:
                    break
                taken.append(delivery)
            try:
                count_dead_requests(
                    self._engine,
                    self.lease,
                    taken,
                    actor=self.id,
                    report=report,
                    namespace=self._names.namespace,
                    hooks=self._hooks,
                )
            except BaseException:
                # Closing the channel hands the unacked messages back to the queue.
                self.close()
                raise
            for delivery in taken:
                self._transport.ack(delivery)
        except BrokerUnavailableError as exc:
            # The sweep does not need the broker; dead requests wait for the next sweep.
            self._broker_ready = False
            log.warning("%s: dead-lettered requests not read: %s", self.id, exc)

    def close(self) -> None:
        """Release the broker connection (`run()` does it on its way out)."""
        if self._transport is not None:
            self._transport.close()
        self._broker_ready = False

    def run(self) -> None:
        """Sweep every `interval` seconds until stopped; survive database and broker outages."""
        if self._dispatcher is not None:
            self._dispatcher.start()
        try:
            while not self._stop.is_set():
                try:
                    report = self.sweep_once()
                except SchemaOutdatedError as exc:
                    self.schema.failed(exc)  # said once; the sweeps go on quietly
                except StoreUnavailableError as exc:
                    log.warning("%s: %s; retrying in %.1fs", self.id, exc, self._options.interval)
                except Exception:  # a bug must not end the daemon: log it, sweep again later
                    log.exception(
                        "%s: sweep failed; retrying in %.1fs", self.id, self._options.interval
                    )
                else:
                    self.schema.ok()
                    if report is not None and (
                        report.reclaimed
                        or report.escalated
                        or report.parked
                        or report.alerts
                        or report.dead_requests
                        or report.pruned
                        or report.audit_pruned
                        or report.subscribers_expired
                        or report.updates_deleted
                        or report.dead_letters_expired
                        or report.agents_lost
                        or report.waited
                        or report.deadlines
                    ):
                        log.info("%s swept: %s", self.id, report.summary())
                self._stop.wait(self._options.interval)
        finally:
            try:
                self.lease.release(self._engine)
            except StoreUnavailableError:
                log.warning("%s: could not release the lease; it expires by itself", self.id)
            if self._dispatcher is not None:
                self._dispatcher.stop()
            self.close()
        log.info("%s stopped", self.id)
