"""The scheduler role: claim ready steps, dispatch requests, apply replies, advance runs.

One thread owns the broker connection and does all database work between broker events; a
LISTEN thread only wakes it. Replies are buffered and applied in one transaction per batch,
then acked together; claims are one statement per batch, and their requests one publish
batch settled by a single wait for the broker's confirms.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field, replace

from sasflow.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    PublishError,
    StoreRefusedError,
    StoreUnavailableError,
)
from sasflow.hooks import Hooks, guarded
from sasflow.messages import DEFAULT_LIMITS, Limits, Reply, Request, parse, safe_text
from sasflow.registry import Registry
from sasflow.relay import Relay
from sasflow.runtime import Reconnect, process_id, serve_forever
from sasflow.scheduler.cluster.member import ClusterMember, ClusterOptions
from sasflow.scheduler.fleet import FleetRecorder
from sasflow.scheduler.inflight import InFlightCap
from sasflow.scheduler.pools import PoolGate
from sasflow.states import StepKind
from sasflow.store import dialect, pools
from sasflow.store.apply import ApplyReport, apply_outcomes, fail_step
from sasflow.store.claim import ClaimedStep, claim, in_flight, release_steps
from sasflow.store.commands import OutcomeKind, StoredError
from sasflow.store.db import Engine, transaction
from sasflow.store.listen import ReadyListener
from sasflow.transport.base import Delivery, Outgoing, Transport
from sasflow.transport.topology import Names, declare_agent_queue, declare_common

log = logging.getLogger(__name__)

RELAY_BATCH = 500
"""Events relayed per batch; a full batch means more are waiting."""

CLAIM_EVENTS_DELAY = 0.01
"""Seconds a claim's events may wait for the relay pass after its replies' apply."""

CAPPED_RECHECK = 0.1
"""Seconds until a scheduler with an agent at its in-flight bound counts again: the replies
that free room may be applied by another scheduler (one reply queue for all), which does not
wake this one."""

CONFIRM_POLL = 0.005
"""Longest wait of the loop while relayed events await their confirms: a confirm does not
end `process` early, and the batch's rows stay locked until it is marked."""


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
    pool_limits: pools.PoolLimits = field(default_factory=pools.PoolLimits)
    """When a step stops waiting for an agent of its pool (recheck_s: the rescan interval)."""
    limits: Limits = DEFAULT_LIMITS
    """Largest and deepest reply accepted; a reply beyond them is dead-lettered with the limit
    in the reason (agents check their own replies first, see docs/protocol.md, section 3)."""
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    """Its registration, lease and schedules (docs/cluster.md)."""


@dataclass
class SchedulerStats:
    claimed: int = 0
    dispatched: int = 0
    released: int = 0
    applied: int = 0
    dropped: int = 0
    dead_lettered: int = 0


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
        self._hooks = guarded(hooks)
        self._engine = engine
        self._transport = transport
        self._registry = registry
        self._names = names
        self._options = options or SchedulerOptions()
        self._stop = stop or threading.Event()
        self._database_url = database_url
        self._replies: list[tuple[Delivery, Reply]] = []
        self._declared_agents: set[str] = set()
        self._wake = threading.Event()
        self._events_dirty = True
        self._claim_events = False
        self._rescan_interval = (
            self._options.rescan_interval
            if self._options.rescan_interval is not None
            else dialect.rescan_interval(engine)
        )
        self.stats = SchedulerStats()
        self._in_flight = InFlightCap(self._options.max_in_flight)
        self._relay = Relay(engine, transport, names, limit=RELAY_BATCH, hooks=self._hooks)
        self.fleet = FleetRecorder(engine, transport, names)
        self._pools = PoolGate(transport, names)
        self.cluster = ClusterMember(
            engine,
            registry,
            self._options.cluster,
            namespace=names.namespace,
            actor=self.id,
            figures=lambda: (self.stats.claimed, self.stats.applied, self._stop.is_set()),
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
            )
            listener.start()
        try:
            serve_forever(self.id, self._serve, self._stop, Reconnect())
        finally:
            if listener is not None:
                listener.stop()
            self._relay.abandon()
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

    def _on_schedules(self) -> None:
        self.cluster.wake()
        self._on_ready()

    # -- the loop -------------------------------------------------------------------------

    def _serve(self) -> None:
        self._replies.clear()  # deliveries of a lost connection are redelivered by the broker
        self._relay.abandon()  # batches published on a lost channel: relayed again
        self._transport.connect()
        declare_common(self._transport, self._names)
        self._declared_agents.clear()
        self._pools.reset()
        for agent in self._registry.agents:
            self._declare_agent(agent.name)
        self._transport.consume(
            self._names.replies, self._on_reply, prefetch=self._options.reply_prefetch
        )
        log.info("%s serving namespace %r", self.id, self._names.namespace)
        next_claim = next_cluster = next_relay = next_fleet = 0.0
        db_retry = Reconnect()
        while not self._stop.is_set():
            busy = False
            try:
                if self._replies:
                    self._apply_buffered()
                    busy = True
                t = time.monotonic()
                next_cluster = t + self.cluster.step()  # fences: no claim without a lease
                if self.cluster.may_act and (self._wake.is_set() or t >= next_claim):
                    self._wake.clear()
                    full, due = self._claim_and_dispatch()
                    next_claim = t + self._rescan_interval
                    if due is not None:  # a retry's backoff ends before the next rescan
                        next_claim = min(next_claim, time.monotonic() + due)
                    if full:
                        self._wake.set()
                        busy = True
                next_relay = self._relay_events(t, next_relay)
                if t >= next_fleet:
                    self.fleet.poll()
                    next_fleet = t + self._options.fleet_interval
                db_retry.reset()
            except StoreUnavailableError as exc:
                delay = db_retry.next_delay()
                # A refusal (rotated password, dropped database) needs an operator: ERROR.
                level = logging.ERROR if isinstance(exc, StoreRefusedError) else logging.WARNING
                log.log(level, "%s: %s; retrying in %.1fs", self.id, exc, delay)
                self._transport.process(delay)  # keeps the broker connection alive meanwhile
                continue
            wait = min(next_claim, next_relay, next_cluster, next_fleet) - time.monotonic()
            wait = 0.0 if busy else max(0.0, wait)
            if self._relay.in_flight:  # its confirms arrive during `process`, which goes on
                wait = min(wait, CONFIRM_POLL)
            self._transport.process(wait)
        self._drain()

    def _relay_events(self, t: float, next_relay: float) -> float:
        """Relay what is due (see Relay); returns when the next relay pass is due."""
        if self._claim_events:
            self._claim_events = False
            next_relay = min(next_relay, time.monotonic() + CLAIM_EVENTS_DELAY)
        if self._events_dirty or t >= next_relay:
            self._events_dirty = self._relay.start() >= RELAY_BATCH
            return t + self._options.relay_interval
        if self._relay.in_flight:
            self._relay.poll()
        return next_relay

    def _drain(self) -> None:
        """On stop: take no new replies, apply and ack the ones held, then return."""
        self._transport.cancel_consumers()
        self._transport.process(0)
        if self._replies:
            self._apply_buffered()
        self._relay.start()
        self._relay.flush()

    # -- replies --------------------------------------------------------------------------

    def _on_reply(self, delivery: Delivery) -> None:
        try:
            reply = parse(Reply, delivery.body, self._options.limits)
        except InvalidMessageError as exc:
            self._transport.dead_letter(
                delivery, str(exc), dead_letter_exchange=self._names.dead_letter_exchange
            )
            self.stats.dead_lettered += 1
            self._hooks.dead_lettered(delivery.queue, str(exc))
            return
        self._replies.append((delivery, reply))

    def _apply_buffered(self) -> None:
        held, self._replies = self._replies, []
        try:
            self._apply(held)
        except StoreUnavailableError:
            self._replies = held + self._replies  # keep them unacked and try again
            raise
        except Exception:
            log.exception(
                "%s: applying %d replies failed; applying them one by one", self.id, len(held)
            )
            for index, item in enumerate(held):
                try:
                    self._apply_alone(item)
                except StoreUnavailableError:
                    self._replies = held[index:] + self._replies  # unacked: try them again
                    raise
            return
        # Tags grow per channel: one multiple-ack of the last covers the batch (dead-lettered
        # ones were acked already; a multiple-ack skips them).
        last = max(held, key=lambda item: item[0].tag)[0]
        self._transport.ack(last, multiple=True)

    def _apply(self, held: list[tuple[Delivery, Reply]]) -> None:
        started = time.monotonic()
        with transaction(self._engine) as conn:
            report = apply_outcomes(
                conn,
                self._registry,
                [r.outcome() for _, r in held],
                namespace=self._names.namespace,
                actor=self.id,
            )
            self._hooks.runs_finished(conn, report.finished)
        self._hooks.replies_applied(held, report, time.monotonic() - started)
        self._count(report)

    def _count(self, report: ApplyReport) -> None:
        self.stats.applied += report.applied
        self.stats.dropped += len(report.dropped)
        # Only applied replies record events worth relaying; dropped ones change nothing.
        self._events_dirty = self._events_dirty or report.applied > 0
        if report.ready or report.backing_off:
            self._wake.set()  # claim what is ready; or learn when the backoff ends
        if self._in_flight.capped and report.applied:
            self._wake.set()  # an agent left out of the last claim may have room again

    def _apply_alone(self, item: tuple[Delivery, Reply]) -> None:
        delivery, reply = item
        try:
            self._apply([item])
        except StoreUnavailableError:
            raise
        except Exception as exc:
            log.exception("%s: reply for step %s cannot be applied", self.id, reply.step_id)
            if not self._apply_instead(reply, exc):
                self._transport.dead_letter(
                    delivery,
                    f"reply could not be applied: {exc!r}",
                    dead_letter_exchange=self._names.dead_letter_exchange,
                )
                self.stats.dead_lettered += 1
                self._hooks.dead_lettered(delivery.queue, "reply could not be applied")
                return
        self._transport.ack(delivery)

    def _apply_instead(self, reply: Reply, exc: Exception) -> bool:
        """The store refused what the reply carries (e.g. a value jsonb cannot hold): fail the
        step with that reason, so the run shows it instead of waiting for its deadline."""
        if OutcomeKind(reply.status) is OutcomeKind.ERROR:
            return False
        error = StoredError("InvalidReplyError", safe_text(f"the reply could not be stored: {exc}"))
        try:
            self._fail(reply.step_id, reply.attempt, error, agent=reply.agent)
        except StoreUnavailableError:
            raise
        except Exception:
            log.exception("%s: could not fail step %s instead", self.id, reply.step_id)
            return False
        return True

    # -- claims ---------------------------------------------------------------------------

    def _claim_and_dispatch(self) -> tuple[bool, float | None]:
        """Claim one batch and publish it. Returns whether the batch was full (more may be
        ready) and, when it was not, the seconds until the earliest backoff ends (so a retry is
        claimed when it is due, not at the next rescan).

        The requests are published only after the claim committed, as one batch settled by
        one wait for the broker's confirms.
        """
        batch = self._options.claim_batch
        started = time.monotonic()
        with transaction(self._engine) as conn:
            skip: list[str] = []
            if self._in_flight.needs_count(batch):
                skip = self._in_flight.counted(in_flight(conn, locked_by=self.id))
                if self._in_flight.all_capped(a.name for a in self._registry.agents):
                    # Nothing to claim, and a claim would walk every pending step to find it.
                    return False, CAPPED_RECHECK
            claimed, due = claim(conn, locked_by=self.id, batch=batch, skip_agents=skip)
            self._hooks.steps_claimed(conn, claimed, time.monotonic() - started)
        if self._in_flight.capped:
            due = CAPPED_RECHECK if due is None else min(due, CAPPED_RECHECK)
        if not claimed:
            return False, due
        claimed_at = time.monotonic()
        self.stats.claimed += len(claimed)
        # A claim follows a submission (its run's `pending` event) and may start runs (their
        # `running` event): relay them within milliseconds rather than at the next interval,
        # so status notifications and the subscription stream see a new run soon, but not
        # at once: the replies to these requests are often back by then, and applying them
        # first keeps a relay pass off their path (their events then go out together).
        self._claim_events = True
        full = len(claimed) == batch
        claimed = self._wait_for_pools(claimed)
        if not claimed:
            return full, due
        try:
            results = self._transport.publish_many(
                [self._request(step, claimed_at) for step in claimed]
            )
        except BrokerUnavailableError as exc:
            # None of the batch may be assumed delivered; a request that did arrive is
            # fenced by its attempt (the re-claim increments it), so its reply is dropped.
            self._release(claimed, f"request not published: {exc}")
            raise
        unsent: list[ClaimedStep] = []
        for step, result in zip(claimed, results, strict=True):
            if isinstance(result, PublishError):
                # The broker refused this request (e.g. too large): retrying cannot help.
                self._fail_unpublishable(step, result)
            elif result is None:
                self.stats.dispatched += 1
                self._in_flight.dispatched(step.agent)
            else:
                unsent.append(step)
        self._hooks.steps_dispatched(len(claimed) - len(unsent), time.monotonic() - claimed_at)
        if unsent:
            self._release(unsent, "request not published: the broker closed the channel")
            raise BrokerUnavailableError("the broker closed the channel while dispatching")
        return full, due

    def _wait_for_pools(self, claimed: list[ClaimedStep]) -> list[ClaimedStep]:
        """The claimed steps that may be dispatched; those whose pool has no agent wait for
        a later pass, or fail past the pool limits (engine/scheduler/pools.py)."""
        try:
            ready, waiting = self._pools.split(claimed)
        except BrokerUnavailableError:
            self._release(claimed, "pool queues not checked: broker unavailable")
            raise
        if waiting:
            limits = replace(self._options.pool_limits, recheck_s=self._rescan_interval)
            with transaction(self._engine) as conn:
                parked = set(
                    pools.park(conn, [s.id for s in waiting], locked_by=self.id, limits=limits)
                )
            for step in waiting:
                if step.id not in parked:
                    error = StoredError("NoAgentInPool", f"no agent in pool {step.pool}")
                    self._fail(step.id, step.attempt, error)
        return ready

    def _request(self, step: ClaimedStep, claimed_at: float) -> Outgoing:
        elapsed_ms = (time.monotonic() - claimed_at) * 1000
        budget_ms = max(1, int(step.timeout_s * 1000 - elapsed_ms))
        request = Request(
            step_id=step.id,
            run_id=step.run_id,
            attempt=step.attempt,
            workflow=step.workflow,
            step=step.name,
            agent=step.agent,
            action=step.action,
            kind=StepKind(step.kind),
            input=step.input,
            idempotency_key=step.idempotency_key,
            budget_ms=budget_ms,
            complete_by=step.complete_by.isoformat(),
        )
        if step.agent not in self._declared_agents:
            self._declare_agent(step.agent)
        return Outgoing(
            exchange="",
            routing_key=self._names.agent_queue(step.agent, step.pool),
            body=request.encode(),
            expiration_ms=budget_ms,
            correlation_id=f"{step.id}:{step.attempt}",
            reply_to=self._names.replies,
            mandatory=True,
            headers=self._hooks.request_headers(step),
        )

    def _fail_unpublishable(self, step: ClaimedStep, exc: PublishError) -> None:
        log.error("%s: step %s cannot be dispatched: %s", self.id, step.id, exc)
        error = StoredError("PublishError", safe_text(f"request refused by the broker: {exc}"))
        self._fail(step.id, step.attempt, error)

    def _fail(
        self, step_id: int, attempt: int, error: StoredError, *, agent: str | None = None
    ) -> None:
        """Fail an attempt for good ourselves (fenced as an agent's error would be)."""
        with transaction(self._engine) as conn:
            report = fail_step(
                conn,
                self._registry,
                step_id,
                attempt,
                error,
                namespace=self._names.namespace,
                actor=self.id,
                agent=agent,
            )
            self._hooks.runs_finished(conn, report.finished)
        self._count(report)

    def _declare_agent(self, agent: str) -> None:
        declare_agent_queue(self._transport, self._names, agent)
        self._declared_agents.add(agent)

    def _release(self, steps: list[ClaimedStep], reason: str) -> None:
        try:
            with transaction(self._engine) as conn:
                self.stats.released += release_steps(conn, steps, locked_by=self.id, reason=reason)
        except StoreUnavailableError:
            log.warning(
                "%s could not release %d steps; the supervisor will recover them",
                self.id,
                len(steps),
            )

    # -- the schedule cluster --------------------------------------------------------------

    def _leave(self) -> None:
        try:
            self.cluster.leave()
        except StoreUnavailableError:
            log.warning("%s could not deregister; its lease expires on its own", self.id)
