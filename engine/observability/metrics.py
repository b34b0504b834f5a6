"""Prometheus metrics of each role, as hooks, in a registry of the role's own.

Names and units follow the Prometheus conventions (`_total` counters, `_seconds`, base units);
labels are bounded by the definitions (workflow, step, agent, dependency, status, state, queue,
alert kind), never a run id or a business key. docs/observability.md lists every metric.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from sasflow.errors import SchemaOutdatedError, StoreUnavailableError
from sasflow.hooks import Headers, Hooks
from sasflow.observability.exposition import MetricsServer, build_info, new_registry
from sasflow.observability.series import Series

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sasflow.commands import FinishedRun
    from sasflow.messages import Reply, Request
    from sasflow.store.db import Connection
    from sasflow.store.operator.gauges import StateCounts
    from sasflow.store.runs.apply import ApplyReport
    from sasflow.store.runs.claim import ClaimedStep
    from sasflow.store.runs.sweeps import SweepReport
    from sasflow.transport.base import Delivery

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
"""Claim and apply batch sizes (items)."""
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""Database and broker round trips (seconds)."""
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
"""Handler durations (seconds): remote calls of milliseconds up to an hour."""


class _Consuming(Hooks):
    """What every role that consumes counts."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.dead_letters = Counter(
            "sasflow_dead_letters",
            "Messages dead-lettered by this process, by the queue they were taken from.",
            ["queue"],
            registry=registry,
        )
        self.consumers_cancelled = Counter(
            "sasflow_consumer_cancellations",
            "Consumers of this process the broker cancelled (queue deleted or its node lost), "
            "by queue; each is followed by a reconnect that declares and consumes it again.",
            ["queue"],
            registry=registry,
        )

    def dead_lettered(self, queue: str, reason: str) -> None:
        self.dead_letters.labels(queue).inc()

    def consumer_cancelled(self, queue: str) -> None:
        self.consumers_cancelled.labels(queue).inc()


class _Relay(_Consuming):
    """What the roles that consume and relay the outbox (scheduler, submitter) count."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.relayed = Counter(
            "sasflow_events_relayed",
            "Status events published from the outbox (the events table).",
            registry=registry,
        )
        self.relay_seconds = Histogram(
            "sasflow_relay_duration_seconds",
            "Time of one relay batch that published events.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def events_relayed(self, count: int, seconds: float) -> None:
        self.relayed.inc(count)
        if count:
            self.relay_seconds.observe(seconds)


class DoorMetrics(Hooks):
    """What the doors that push back (the submitter, the HTTP API) count."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.refused = Counter(
            "sasflow_submissions_refused",
            "Submissions that found their workflow's backlog at its bound, by workflow and "
            "door (api: answered 429; submitter: held in its queue or dead-lettered).",
            ["workflow", "door"],
            registry=registry,
        )

    def submissions_refused(self, workflow: str, door: str, count: int) -> None:
        self.refused.labels(workflow, door).inc(count)


class SubmitterMetrics(_Relay, DoorMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        _Relay.__init__(self, registry)
        DoorMetrics.__init__(self, registry)
        self.submitted = Counter(
            "sasflow_runs_submitted",
            "Submissions recorded: result=created (a new run) or duplicate (same key).",
            ["result"],
            registry=registry,
        )

        self._created = self.submitted.labels("created")
        self._duplicates = self.submitted.labels("duplicate")

    def runs_submitted(self, created: int, duplicates: int) -> None:
        self._created.inc(created)
        self._duplicates.inc(duplicates)


class _RunsFinished(Hooks):
    def __init__(self, registry: CollectorRegistry) -> None:
        self.finished = Counter(
            "sasflow_runs_finished",
            "Runs that reached a terminal state, by workflow and that state.",
            ["workflow", "state"],
            registry=registry,
        )
        self._finished = Series(self.finished)

    def runs_finished(self, conn: Connection, finished: Mapping[int, FinishedRun]) -> None:
        # One increment per (workflow, state) of the batch, not one per run.
        counts: dict[tuple[str, str], int] = {}
        for run in finished.values():
            key = (run.workflow, run.state)
            counts[key] = counts.get(key, 0) + 1
        for (workflow, state), count in counts.items():
            self._finished.of(workflow, state).inc(count)


class SchedulerMetrics(_Relay, _RunsFinished):
    def __init__(self, registry: CollectorRegistry) -> None:
        _Relay.__init__(self, registry)
        _RunsFinished.__init__(self, registry)
        self.claimed = Counter(
            "sasflow_steps_claimed", "Steps claimed for dispatch.", registry=registry
        )
        self.claim_batch = Histogram(
            "sasflow_claim_batch_size",
            "Steps taken by one claim statement that found work.",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.claim_seconds = Histogram(
            "sasflow_claim_duration_seconds",
            "Time of one claim statement.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.dispatched = Counter(
            "sasflow_steps_dispatched",
            "Requests confirmed by the broker.",
            registry=registry,
        )
        self.dispatch_seconds = Histogram(
            "sasflow_dispatch_duration_seconds",
            "Time from a claim's commit until the broker confirmed its requests.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.applied = Counter(
            "sasflow_replies_applied",
            "Replies applied, by status (ok, error, failed, deferred).",
            ["status"],
            registry=registry,
        )
        self.dropped = Counter(
            "sasflow_replies_dropped",
            "Replies dropped as stale or duplicate (their attempt was fenced).",
            registry=registry,
        )
        self.apply_batch = Histogram(
            "sasflow_apply_batch_size",
            "Replies applied in one transaction.",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.apply_seconds = Histogram(
            "sasflow_apply_duration_seconds",
            "Time of one apply transaction.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.limit_admitted = Counter(
            "sasflow_limit_admitted",
            "Steps this scheduler's budgeted claims admitted, by flow limit (implicit ones: "
            "fleet:AGENT, breaker:AGENT/DEPENDENCY).",
            ["limit"],
            registry=registry,
        )
        self.limit_tokens = Gauge(
            "sasflow_limit_tokens",
            "Steps a rate limit (without a key) would start at once, after this scheduler's "
            "last claim under it.",
            ["limit"],
            registry=registry,
        )
        self._applied = Series(self.applied)
        self._limit_admitted = Series(self.limit_admitted)
        self._limit_tokens = Series(self.limit_tokens)

    def steps_budgeted(
        self, admitted: Mapping[str, int], held: Mapping[str, int], tokens: Mapping[str, float]
    ) -> None:
        for name, count in admitted.items():
            self._limit_admitted.of(name).inc(count)
        for name, left in tokens.items():
            self._limit_tokens.of(name).set(left)

    def steps_claimed(self, conn: Connection, steps: Sequence[ClaimedStep], seconds: float) -> None:
        self.claim_seconds.observe(seconds)
        if steps:
            self.claimed.inc(len(steps))
            self.claim_batch.observe(len(steps))

    def steps_dispatched(self, count: int, seconds: float) -> None:
        self.dispatched.inc(count)
        self.dispatch_seconds.observe(seconds)

    def replies_applied(
        self, replies: Sequence[tuple[Delivery, Reply]], report: ApplyReport, seconds: float
    ) -> None:
        dropped = {(o.step_id, o.attempt) for o in report.dropped}
        # One increment per status of the batch, not one per reply.
        counts: dict[str, int] = {}
        for _, reply in replies:
            if (reply.step_id, reply.attempt) not in dropped:
                counts[reply.status] = counts.get(reply.status, 0) + 1
        for status, count in counts.items():
            self._applied.of(status).inc(count)
        if report.dropped:
            self.dropped.inc(len(report.dropped))
        self.apply_batch.observe(len(replies))
        self.apply_seconds.observe(seconds)


class AgentMetrics(_Consuming):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.duration = Histogram(
            "sasflow_step_duration_seconds",
            "Time an agent spent on one attempt of a step (the handler with its retries).",
            ["workflow", "step", "agent"],
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self.outcomes = Counter(
            "sasflow_handler_outcomes",
            "Attempts an agent finished, by the reply's status (silent: no reply, the "
            "deadline passed).",
            ["agent", "status"],
            registry=registry,
        )
        self.retries = Counter(
            "sasflow_handler_retries",
            "Transient handler errors retried inside an attempt.",
            ["agent", "action"],
            registry=registry,
        )
        self.breaker_open = Gauge(
            "sasflow_breaker_open",
            "1 while the breaker of an agent's dependency is open (or half-open), else 0.",
            ["agent", "dependency"],
            registry=registry,
        )
        self.threads_held_gauge = Gauge(
            "sasflow_agent_threads_held",
            "Worker threads of the agent process held by handlers running past their deadline.",
            ["agent"],
            registry=registry,
        )
        self.wedged = Gauge(
            "sasflow_agent_wedged",
            "1 while every worker thread of the agent process is held past its deadline (it "
            "takes no requests), else 0.",
            ["agent"],
            registry=registry,
        )
        self._duration = Series(self.duration)
        self._outcomes = Series(self.outcomes)
        self._retries = Series(self.retries)

    def handler_retrying(self, request: Request, error: BaseException, attempt: int) -> None:
        self._retries.of(request.agent, request.action).inc()

    def handler_finished(
        self,
        request: Request,
        reply: Reply | None,
        seconds: float,
        breaker: str | None,
    ) -> Headers | None:
        self._duration.of(request.workflow, request.step, request.agent).observe(seconds)
        self._outcomes.of(request.agent, reply.status if reply else "silent").inc()
        return None

    def breaker_changed(self, agent: str, dependency: str, state: str) -> None:
        self.breaker_open.labels(agent, dependency).set(0 if state == "closed" else 1)

    def threads_held(self, agent: str, held: int, concurrency: int) -> None:
        self.threads_held_gauge.labels(agent).set(held)
        self.wedged.labels(agent).set(1 if held >= concurrency else 0)


class SupervisorMetrics(_RunsFinished):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.expired = Counter(
            "sasflow_sweep_expired",
            "Steps whose deadline passed with no reply: a failure counted by the supervisor.",
            registry=registry,
        )
        self.dead_requests = Counter(
            "sasflow_sweep_dead_requests",
            "Dead-lettered requests counted as a failure of their attempt by the supervisor.",
            registry=registry,
        )
        self.wait_expiries = Counter(
            "sasflow_wait_expiries",
            "Requests no agent took within their wait timeout (the wait clock), by agent: the "
            "step is pending again and no failure is counted.",
            ["agent"],
            registry=registry,
        )
        self.alerts = Counter(
            "sasflow_alerts_raised",
            "Alerts raised in the cluster, by kind (counted when the supervisor delivers them).",
            ["kind"],
            registry=registry,
        )
        self.sweep_seconds = Histogram(
            "sasflow_sweep_duration_seconds",
            "Time of one sweep by the leading supervisor.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.leader = Gauge(
            "sasflow_supervisor_leader",
            "1 while this supervisor holds the lease and sweeps, 0 on standby.",
            registry=registry,
        )
        self.last_sweep = LastSweep()
        registry.register(self.last_sweep)
        self.removed = Counter(
            "sasflow_retention_removed",
            "What the supervisor's retention removed, by what: runs (finished, with their "
            "steps, events and alerts), inbound_events (consumed by those runs' waits), "
            "audit_records, subscribers (expired), stream_updates "
            "(of expired subscribers), dead_letters (from <ns>.dead, each audited).",
            ["what"],
            registry=registry,
        )

    def steps_expired(self, conn: Connection, rows: Sequence[Any], reason: str) -> None:
        (self.expired if reason == "expired" else self.dead_requests).inc(len(rows))

    def wait_expired(self, conn: Connection, rows: Sequence[Any]) -> None:
        for row in rows:
            self.wait_expiries.labels(row.agent).inc()

    def sweep_finished(self, report: SweepReport | None) -> None:
        self.leader.set(0 if report is None else 1)
        if report is None:
            self.last_sweep.forget()
        else:
            self.sweep_seconds.observe(report.seconds)
            self.last_sweep.swept(time.time())
            for what, count in (
                ("runs", report.pruned),
                ("inbound_events", report.inbound_pruned),
                ("audit_records", report.audit_pruned),
                ("subscribers", report.subscribers_expired),
                ("stream_updates", report.updates_deleted),
                ("dead_letters", report.dead_letters_expired),
            ):
                self.removed.labels(what).inc(count)

    def alert_raised(self, kind: str) -> None:
        self.alerts.labels(kind).inc()


class LastSweep(Collector):
    """`sasflow_supervisor_last_sweep_timestamp_seconds`, while this supervisor leads.

    A standby supervisor (one that does not hold the lease) has no sample: a 0 would read as
    "never swept" and trip any `time() - x > N` rule on every standby. So
    `max(sasflow_supervisor_last_sweep_timestamp_seconds)` is the last sweep of the leader,
    and the series is absent when no supervisor leads. A leader that loses the lease drops its
    sample at its next attempt to sweep."""

    NAME = "sasflow_supervisor_last_sweep_timestamp_seconds"
    HELP = (
        "Unix time at which this supervisor last finished a sweep, while it is the leader "
        "(no sample on standby)."
    )

    def __init__(self) -> None:
        self._at: float | None = None
        self._lock = threading.Lock()

    def swept(self, at: float) -> None:
        with self._lock:
            self._at = at

    def forget(self) -> None:
        with self._lock:
            self._at = None

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.NAME, self.HELP)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            at = self._at
        family = GaugeMetricFamily(self.NAME, self.HELP)
        if at is not None:
            family.add_metric([], at)
        yield family


ROLE_METRICS: Mapping[str, Callable[[CollectorRegistry], Hooks]] = {
    "scheduler": SchedulerMetrics,
    "submitter": SubmitterMetrics,
    "agent": AgentMetrics,
    "supervisor": SupervisorMetrics,
}


def role_metrics(
    role: str,
    port: int,
    address: str,
    collectors: Sequence[Collector] = (),
    *,
    schema: str | None = None,
) -> list[Hooks]:
    """The metrics hooks of `role` and the server that exposes them (close it at exit);
    `schema`: the migration head its code expects (`sasflow_build_info`)."""
    registry = new_registry()
    build_info(registry, role, schema)
    hooks = [ROLE_METRICS[role](registry)]
    for collector in collectors:
        registry.register(collector)
    return [*hooks, MetricsServer(registry, port, address)]


class ApiMetrics:
    """Metrics of the HTTP API server, rendered by its own `/metrics` route.

    Wiring (any framework): build one `ApiMetrics()` at start-up; call
    `observe(method, route, status, seconds)` after each request, with the route's template
    (`/runs/{run_id}`, never the concrete path: a label per run would be unbounded); answer
    `GET /metrics` with `body, content_type = metrics.render()`.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, schema: str | None = None
    ) -> None:
        self.registry = registry or new_registry()
        build_info(self.registry, "api", schema)
        self.requests = Counter(
            "sasflow_http_requests",
            "HTTP requests answered by the API, by method, route template and status code.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "sasflow_http_request_duration_seconds",
            "Time to answer one HTTP request, by route template.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.doors = DoorMetrics(self.registry)
        """The hooks the API's door calls (submissions refused)."""

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method.upper(), route, str(status)).inc()
        self.duration.labels(route).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its Content-Type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class LimitGauges(Collector):
    """The supervisor's gauge of the steps each flow limit holds (its ready steps), read from
    the database on a scrape (at most every `min_interval` seconds; see store.flow.state)."""

    def __init__(self, read: Callable[[], Mapping[str, int]], min_interval: float = 5.0) -> None:
        self._read = read
        self._min_interval = min_interval
        self._cached: Mapping[str, int] | None = None
        self._at = 0.0
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._at >= self._min_interval:
                try:
                    self._cached, self._at = self._read(), now
                except StoreUnavailableError as exc:
                    if not isinstance(exc, SchemaOutdatedError):  # the role's loop says that once
                        log.warning("limit gauges not read: %s", exc)
                    self._cached = None
            counts = self._cached
        if counts is None:
            return
        held = GaugeMetricFamily(
            "sasflow_limit_held_steps",
            "Ready steps a flow limit selects: held while it has no room.",
            labels=["limit"],
        )
        for name, value in sorted(counts.items()):
            held.add_metric([name], value)
        yield held


class StateGauges(Collector):
    """The supervisor's gauges of work by state, read from the database on a scrape (at most
    every `min_interval` seconds; cheap counts served by indexes, see store.gauges). A scrape
    while the database is away answers without them and logs why."""

    def __init__(self, read: Callable[[], StateCounts], min_interval: float = 5.0) -> None:
        self._read = read
        self._min_interval = min_interval
        self._cached: StateCounts | None = None
        self._at = 0.0
        self._lock = threading.Lock()

    def _counts(self) -> StateCounts | None:
        with self._lock:  # concurrent scrapes share one read
            now = time.monotonic()
            if self._cached is None or now - self._at >= self._min_interval:
                try:
                    self._cached, self._at = self._read(), now
                except StoreUnavailableError as exc:
                    if not isinstance(exc, SchemaOutdatedError):  # the role's loop says that once
                        log.warning("state gauges not read: %s", exc)
                    self._cached = None
            return self._cached

    def collect(self) -> Iterator[Metric]:
        counts = self._counts()
        if counts is None:
            return
        runs = GaugeMetricFamily(
            "sasflow_runs", "Runs not yet finished, by state.", labels=["state"]
        )
        for state, value in counts.runs.items():
            runs.add_metric([state], value)
        yield runs
        steps = GaugeMetricFamily(
            "sasflow_steps",
            "Steps waiting for a claim (pending) or for a reply (processing).",
            labels=["state"],
        )
        for state, value in counts.steps.items():
            steps.add_metric([state], value)
        yield steps
        yield GaugeMetricFamily(
            "sasflow_schedulers_alive",
            "Schedulers whose heartbeat is recent.",
            value=counts.schedulers_alive,
        )
        backlog = GaugeMetricFamily(
            "sasflow_backlog_runs",
            "Runs submitted and not started yet (a workflow's backlog, docs/backpressure.md), "
            "by workflow; a workflow with none is absent.",
            labels=["workflow"],
        )
        for workflow, value in sorted(counts.backlog.items()):
            backlog.add_metric([workflow], value)
        yield backlog
        yield GaugeMetricFamily(
            "sasflow_supervisor_lease_remaining_seconds",
            "Seconds until the supervisor lease expires unless renewed (negative: expired).",
            value=counts.lease_remaining,
        )
