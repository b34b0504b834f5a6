"""The scheduler role's loop: one thread owns the broker connection and does all database
work between broker events; a LISTEN thread only wakes it.

Each pass applies the replies held (one transaction per batch, acked together), reads the
clock once and runs the duties in order (sasflow.scheduler.duty): the cluster membership
(lease and schedules; it fences the claim), the flow plan, the advance duty (runs that need
user code, run on its pool off this thread, or a scheduler with their version: it never
waits for that code), the event waits, the claim and dispatch of ready steps (one
statement per batch, its requests one publish batch settled by one wait for the broker's
confirms), the timers (after the claim: a wake-up's claim is not kept waiting by their
transaction), the relay of recorded events, the recording of agent heartbeats. Then it waits for
broker events until the earliest duty is due.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from sasflow.errors import (
    BrokerUnavailableError,
    SchemaOutdatedError,
    StoreRefusedError,
    StoreUnavailableError,
)
from sasflow.hooks import Hooks, guarded
from sasflow.registry import Registry
from sasflow.relay import Relay
from sasflow.runtime import Reconnect, process_id, serve_forever
from sasflow.scheduler.advancing import AdvanceDuty
from sasflow.scheduler.claims import ClaimDuty, ClusterDuty
from sasflow.scheduler.cluster.member import ClusterMember
from sasflow.scheduler.context import Context, SchedulerStats
from sasflow.scheduler.dispatch import Dispatcher
from sasflow.scheduler.duty import INF, Duty, Periodic
from sasflow.scheduler.event_waits import EventWaitDuty
from sasflow.scheduler.fleet import FleetRecorder
from sasflow.scheduler.flow import FlowDuty
from sasflow.scheduler.inflight import InFlightCap
from sasflow.scheduler.options import SchedulerOptions
from sasflow.scheduler.outbox import RELAY_BATCH, RelayDuty
from sasflow.scheduler.replies import Replies
from sasflow.scheduler.timers import TimerDuty
from sasflow.schema_watch import SchemaWatch
from sasflow.store import dialect
from sasflow.store.db import Engine
from sasflow.store.listen import ReadyListener
from sasflow.transport.base import Transport
from sasflow.transport.topology import Names, declare_common

log = logging.getLogger(__name__)


class Scheduler:
    """One scheduler process. `run()` returns when `stop` is set, after applying what it holds."""

    def __init__(
        self,
        engine: Engine,
        transport: Transport,
        registry: Registry,
        names: Names,
        *,
        database_url: str,
        options: SchedulerOptions | None = None,
        stop: threading.Event | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.id = process_id("scheduler")
        self._engine = engine
        self._transport = transport
        self._names = names
        self._options = options = options or SchedulerOptions()
        self._stop = stop or threading.Event()
        self._database_url = database_url
        self._wake = threading.Event()
        self.stats = SchedulerStats()
        self._hooks = guarded(hooks)
        self.schema = SchemaWatch(engine, self.id)
        ctx = Context(
            id=self.id,
            engine=engine,
            transport=transport,
            registry=registry,
            names=names,
            hooks=self._hooks,
            stats=self.stats,
            wake=self._wake,
            advance=threading.Event(),
        )
        rescan_interval = (
            options.rescan_interval
            if options.rescan_interval is not None
            else dialect.rescan_interval(engine)
        )
        in_flight = InFlightCap(options.max_in_flight)
        self.flow = FlowDuty(
            engine,
            self._wake,
            fleet_bound=options.fleet_bound,
            fleet_factor=options.fleet_bound_factor,
        )
        self._outbox = RelayDuty(
            Relay(engine, transport, names, limit=RELAY_BATCH, hooks=ctx.hooks),
            interval=options.relay_interval,
        )
        self._replies = Replies(
            ctx, options.limits, in_flight=in_flight, outbox=self._outbox, flow=self.flow
        )
        self._dispatcher = Dispatcher(
            ctx,
            options,
            rescan_interval=rescan_interval,
            in_flight=in_flight,
            replies=self._replies,
            outbox=self._outbox,
            flow=self.flow,
        )
        self.fleet = FleetRecorder(engine, transport, names, on_change=self.flow.refresh)
        self.cluster = ClusterMember(
            engine,
            registry,
            options.cluster,
            namespace=names.namespace,
            actor=self.id,
            figures=lambda: (self.stats.claimed, self.stats.applied, self._stop.is_set()),
        )
        self._advancing = AdvanceDuty(ctx, options.advance, outbox=self._outbox, woken=ctx.advance)
        timers = TimerDuty(ctx, self.cluster, outbox=self._outbox, rescan_interval=rescan_interval)
        # Run in this order at each pass (see the module docstring).
        self._duties: tuple[Duty, ...] = (
            ClusterDuty(self.cluster),  # first: no claim without a lease
            self.flow,  # before the claim: the plan it claims under
            self._advancing,  # before the claim: the steps it makes ready are claimed in the pass
            # Before the claim: the steps its matches make ready are claimed in the pass (it
            # runs at its times, not at wake-ups).
            EventWaitDuty(ctx, self.cluster, outbox=self._outbox, rescan_interval=rescan_interval),
            ClaimDuty(
                self.cluster,
                self._dispatcher,
                self._wake,
                rescan_interval=rescan_interval,
                passes_wake_to=timers.woken,
            ),
            # After the claim, so that a wake-up's claim does not wait for its transaction: the
            # claim passes the wake-up on; the steps its timers make ready are claimed at the
            # next pass, which it asks for at once.
            timers,
            self._outbox,
            Periodic(options.fleet_interval, self.fleet.poll),
        )

    @property
    def stop_event(self) -> threading.Event:
        return self._stop

    def stop(self) -> None:
        """Stop as SIGTERM does, and wake the loop instead of letting it finish its wait."""
        self._stop.set()
        self._on_ready()

    def run(self) -> None:
        listener = None
        if dialect.has_notifications(self._engine):  # else the short rescan is the wake-up
            listener = ReadyListener(
                self._database_url,
                self._names.namespace,
                self._on_ready,
                name=self.id,
                on_schedules=self._on_schedules,
                on_limits=self._on_limits,
            )
            listener.start()
        try:
            serve_forever(
                self.id, self._serve, self._stop, Reconnect(), self._hooks.consumer_cancelled
            )
        finally:
            if listener is not None:
                listener.stop()
            self._outbox.abandon()
            self._advancing.close()
            self._leave()
            self._transport.close()
        log.info("%s stopped: %s", self.id, self.stats)

    # -- wake-ups -------------------------------------------------------------------------

    def _on_ready(self) -> None:
        if self._wake.is_set():
            return
        self._wake.set()
        # While the loop reconnects it cannot be woken; it claims right after connecting.
        with contextlib.suppress(BrokerUnavailableError):
            self._transport.call_threadsafe(lambda: None)

    def _on_limits(self) -> None:
        self.flow.refresh()
        self._on_ready()

    def _on_schedules(self) -> None:
        self.cluster.wake()
        self._on_ready()

    # -- the loop -------------------------------------------------------------------------

    def _serve(self) -> None:
        replies, duties, transport = self._replies, self._duties, self._transport
        replies.clear()  # deliveries of a lost connection are redelivered by the broker
        self._outbox.abandon()  # batches published on a lost channel: relayed again
        transport.connect()
        declare_common(transport, self._names)
        self._dispatcher.connected()
        transport.consume(
            self._names.replies, replies.on_reply, prefetch=self._options.reply_prefetch
        )
        log.info("%s serving namespace %r", self.id, self._names.namespace)
        for duty in duties:
            duty.reset()
        db_retry = Reconnect()
        while not self._stop.is_set():
            longest = INF  # the longest wait the pass allows; 0.0: busy, no wait
            due = INF  # when the earliest duty is due
            try:
                if replies.waiting:
                    replies.apply()
                    longest = 0.0
                t = time.monotonic()
                # Comparisons, not min(): a builtin call and its argument tuple per duty and pass.
                for duty in duties:
                    allowed = duty.run(t)
                    if allowed < longest:  # noqa: PLR1730
                        longest = allowed
                    if duty.due < due:  # noqa: PLR1730
                        due = duty.due
                db_retry.reset()
                self.schema.ok()
            except StoreUnavailableError as exc:
                delay = db_retry.next_delay()
                if isinstance(exc, SchemaOutdatedError):
                    self.schema.failed(exc)  # said once; the retries are quiet
                else:
                    # A refusal (rotated password, dropped database) needs an operator: ERROR.
                    level = logging.ERROR if isinstance(exc, StoreRefusedError) else logging.WARNING
                    log.log(level, "%s: %s; retrying in %.1fs", self.id, exc, delay)
                transport.process(delay)  # keeps the broker connection alive meanwhile
                continue
            wait = 0.0
            if longest > 0.0:
                wait = due - time.monotonic()
                if wait > longest:
                    wait = longest
                elif wait < 0.0:
                    wait = 0.0
            transport.process(wait)
        self._drain()

    def _drain(self) -> None:
        """On stop: take no new replies, apply and ack the ones held, then return."""
        self._transport.cancel_consumers()
        self._transport.process(0)
        if self._replies.waiting:
            self._replies.apply()
        self._outbox.drain()

    def _leave(self) -> None:
        try:
            self.cluster.leave()
        except StoreUnavailableError:
            log.warning("%s could not deregister; its lease expires on its own", self.id)
