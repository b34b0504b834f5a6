"""Overload: more work than the agent can take, and an agent away under load.

The roles run as `sasflow` processes with their default settings (a scheduler, a submitter, a
supervisor and one agent process of `bench.overload_app`: `--concurrency 1`, a handler of
0.1 s, so about 10 steps a second; step timeout 5 s). The bench publishes one submission
message per run to `<ns>.submit` at a fixed rate, the way an application feeds the submitter.

- scenario A: 30 runs/s for 90 s (three times what the agent can do);
- scenario B: 5 runs/s for 120 s; the agent process is killed (SIGKILL) 20 s in and started
  again 60 s later.

Both then drain until every run has ended, or the drain timeout. Printed per scenario: the
runs, how they ended, the failures counted (the sum of the steps' `failure_count`, and the
supervisor's failure events by reason), the requests that expired unconsumed in the agent's
queue (the broker's dead letters with reason `expired`, read from `<ns>.dead`), the dispatches
(steps claimed: `pending -> processing` events), the alerts by kind, the time from the first
submission until the last run ended (database clock), the most messages `<ns>.dead` held, the
WARNING lines the supervisor logged, and the machine's load. Roles read their settings from the
environment as always: `SASFLOW_SCHEDULER_MAX_IN_FLIGHT=40 python bench/run.py --only overload`
measures another configuration.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pika
from sqlalchemy import Engine, text

from bench.common import database_clock, processes, scratch, wait_until
from bench.report import Results, load_line, say
from sasflow.messages import Submission
from sasflow.transport.base import Outgoing
from sasflow.transport.topology import Names, declare_common
from tests import harness, services
from tests.acceptance.processes import Processes

APP = "bench.overload_app"
AGENT = "paced"
WORKFLOW = "overload"
TICK_S = 0.1
"""The feed publishes what is due every tick (3 messages a tick at 30 runs/s)."""
SAMPLE_S = 0.5
"""Seconds between two looks at the queues' depths."""
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    rate: float
    """Runs submitted per second."""
    feed_s: float
    """Seconds the feed lasts."""
    kill_at: float | None = None
    """Seconds into the feed at which the agent is killed (None: never)."""
    away_s: float = 0.0
    """Seconds the agent stays dead before it is started again."""
    drain_timeout_s: float = 600.0

    def describe(self) -> str:
        text_ = (
            f"scenario {self.name}: one agent process (--concurrency 1, 0.1 s per step: ~10 "
            f"steps/s), fed {self.rate:g} runs/s for {self.feed_s:g}s, step timeout 5 s"
        )
        if self.kill_at is not None:
            text_ += (
                f"; the agent killed (SIGKILL) at {self.kill_at:g}s for {self.away_s:g}s, "
                "then started again"
            )
        return text_


def scenarios(quick: bool) -> list[Scenario]:
    if quick:
        return [
            Scenario("A", 30, 20, drain_timeout_s=300),
            Scenario("B", 5, 45, kill_at=5, away_s=30, drain_timeout_s=300),
        ]
    return [Scenario("A", 30, 90), Scenario("B", 5, 120, kill_at=20, away_s=60)]


@dataclass
class Depths:
    """The most messages each watched queue (by label) held at one look."""

    most: Counter[str] = field(default_factory=Counter)

    def see(self, label: str, depth: int) -> None:
        self.most[label] = max(self.most[label], depth)


@dataclass
class Outcome:
    runs: int
    states: dict[str, int]
    failure_count: int
    failure_events: dict[str, int]
    expired_in_queue: int
    dead_reasons: dict[str, int]
    dispatches: int
    alerts: dict[str, int]
    drain_s: float
    drained: bool
    depths: Depths
    warnings: int
    load_before: str
    load_after: str


@contextlib.contextmanager
def watching(names: Names, queues: dict[str, str], depths: Depths) -> Iterator[None]:
    """Sample the depth of `queues` (label -> queue) every SAMPLE_S seconds in a thread of
    its own."""
    stop = threading.Event()

    def watch() -> None:
        with services.broker_channel() as channel:
            while not stop.is_set():
                for label, queue in queues.items():
                    try:
                        declared = channel.queue_declare(queue, passive=True)
                    except pika.exceptions.ChannelClosedByBroker:
                        return  # a queue that does not exist yet: watch() is started late
                    depths.see(label, int(declared.method.message_count or 0))
                stop.wait(SAMPLE_S)

    thread = threading.Thread(target=watch, name=f"watch-{names.namespace}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def _grouped(engine: Engine, sql: str) -> dict[str, int]:
    with engine.connect() as conn:
        return {str(k): int(v) for k, v in conn.execute(text(sql)).all()}


def dead_letter_reasons(queue: str) -> dict[str, int]:
    """The dead letters in `queue` by why they died: the broker's `x-death` reason (`expired`,
    `rejected`, `maxlen`) or sasflow's reason header; read without acking (closing the channel
    hands them all back)."""
    reasons: Counter[str] = Counter()
    with services.broker_channel() as channel:
        channel.basic_qos(prefetch_count=0)  # no limit: every message of the queue, unacked
        for method, properties, _body in channel.consume(queue, inactivity_timeout=1.0):
            if method is None or properties is None:
                break
            headers = properties.headers or {}
            deaths = headers.get("x-death") or []
            if deaths:
                reasons[f"broker: {deaths[0].get('reason', '?')}"] += 1
            else:
                reasons[f"sasflow: {str(headers.get('x-sasflow-reason', '?'))[:40]}"] += 1
        channel.cancel()
    return dict(reasons)


def start_roles(procs: Processes, engine: Engine) -> None:
    procs.start("supervisor", "supervisor")
    procs.start("scheduler", "scheduler")
    procs.start("submitter", "submitter")
    procs.start("agent", "agent", AGENT, "--concurrency", "1")
    live = "SELECT count(*) FROM agent_instances WHERE state = 'live'"
    if not wait_until(lambda: _count(engine, live) >= 1, START_TIMEOUT_S, interval=0.2):
        raise RuntimeError(f"the agent did not report live; logs in {procs.logs}")


def feed(procs: Processes, names: Names, scenario: Scenario) -> None:
    """Publish `rate` submissions a second for `feed_s` seconds; kill and restart the agent on
    the scenario's schedule (the agent is started again after the feed if it is still away)."""
    transport = harness.transport("overload-feed")
    transport.connect()
    declare_common(transport, names)
    total = int(scenario.rate * scenario.feed_s)
    sent = 0
    killed_at: float | None = None
    restarted = False
    began = time.monotonic()
    try:
        while sent < total or (killed_at is not None and not restarted):
            elapsed = time.monotonic() - began
            due = min(total, int(elapsed * scenario.rate) + 1)
            if due > sent:
                batch = [
                    Outgoing(
                        "",
                        names.submit,
                        Submission(workflow=WORKFLOW, input={"i": i}, key=f"ov{i}").encode(),
                    )
                    for i in range(sent, due)
                ]
                refused = [e for e in transport.publish_many(batch) if e is not None]
                if refused:
                    raise RuntimeError(f"publish refused: {refused[0]}")
                sent = due
            if scenario.kill_at is not None and killed_at is None and elapsed >= scenario.kill_at:
                procs.signal("agent", 9)
                procs.wait("agent")
                killed_at = elapsed
            if killed_at is not None and not restarted and elapsed >= killed_at + scenario.away_s:
                procs.start("agent", "agent", AGENT, "--concurrency", "1")
                restarted = True
            time.sleep(max(0.0, TICK_S - (time.monotonic() - began - elapsed)))
    finally:
        transport.close()


def overload_once(scenario: Scenario) -> Outcome:
    total = int(scenario.rate * scenario.feed_s)
    with (
        scratch("ovl", [AGENT]) as (url, engine, names),
        processes(url, names, APP) as procs,
    ):
        start_roles(procs, engine)
        depths = Depths()
        queues = {
            "dead": names.dead_letter_queue,
            "submit": names.submit,
            "agent": names.agent(AGENT),
        }
        load_before = load_line()
        started = database_clock(engine)
        ended = (
            "SELECT count(*) FROM runs WHERE state IN "
            "('completed', 'error', 'compensated', 'compensation_failed', 'cancelled')"
        )
        with watching(names, queues, depths):
            feed(procs, names, scenario)
            drained = wait_until(
                lambda: _count(engine, ended) >= total, scenario.drain_timeout_s, interval=1.0
            )
        load_after = load_line()
        with engine.connect() as conn:
            last_end = float(
                conn.execute(
                    text("SELECT coalesce(extract(epoch FROM max(finished_at)), 0) FROM runs")
                ).scalar_one()
            )
        reasons = dead_letter_reasons(names.dead_letter_queue)
        outcome = Outcome(
            runs=_count(engine, "SELECT count(*) FROM runs"),
            states=_grouped(engine, "SELECT state, count(*) FROM runs GROUP BY state"),
            failure_count=_count(engine, "SELECT coalesce(sum(failure_count), 0) FROM steps"),
            failure_events=_grouped(
                engine,
                "SELECT coalesce(reason, '?'), count(*) FROM events WHERE entity = 'step' "
                "AND from_state = 'processing' AND to_state IN ('pending', 'error') "
                "AND actor LIKE 'supervisor%' GROUP BY reason",
            ),
            expired_in_queue=reasons.get("broker: expired", 0),
            dead_reasons=reasons,
            dispatches=_count(
                engine,
                "SELECT count(*) FROM events WHERE entity = 'step' AND to_state = 'processing'",
            ),
            alerts=_grouped(engine, "SELECT kind, count(*) FROM alerts GROUP BY kind"),
            drain_s=(last_end - started) if last_end else float("nan"),
            drained=drained,
            depths=depths,
            warnings=procs.log("supervisor").count(" WARNING "),
            load_before=load_before,
            load_after=load_after,
        )
        if not drained:
            say(f"    not drained after {scenario.drain_timeout_s:g}s; logs were in {procs.logs}")
        return outcome


def _mapping(values: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(values.items())) or "none"


def print_outcome(scenario: Scenario, outcome: Outcome, results: Results) -> None:
    states = outcome.states
    runs = outcome.runs
    error = states.get("error", 0)
    share = f" ({error / runs:.0%})" if runs else ""
    say(
        f"  runs                      {runs:,} (fed {int(scenario.rate * scenario.feed_s):,})",
        results,
    )
    say(f"  completed                 {states.get('completed', 0):,}", results)
    say(f"  error                     {error:,}{share}", results)
    say(f"  runs by state             {_mapping(states)}", results)
    say(
        f"  failures counted          {outcome.failure_count:,} (sum of failure_count); "
        f"supervisor's failure events: {_mapping(outcome.failure_events)}",
        results,
    )
    say(
        f"  requests expired in queue {outcome.expired_in_queue:,} (dead letters in "
        f".dead by reason: {_mapping(outcome.dead_reasons)})",
        results,
    )
    say(f"  dispatches (claims)       {outcome.dispatches:,}", results)
    alerts = sum(outcome.alerts.values())
    say(f"  alerts raised             {alerts:,} ({_mapping(outcome.alerts)})", results)
    drained = "" if outcome.drained else " (NOT drained: drain timeout)"
    say(f"  wall time to drain        {outcome.drain_s:.0f}s{drained}", results)
    most = outcome.depths.most
    dead_max = most.get("dead", 0)
    say(
        f"  max messages in .dead     {dead_max:,} (max in .submit {most.get('submit', 0):,}, "
        f"in the agent's queue {most.get('agent', 0):,})",
        results,
    )
    say(f"  supervisor WARNING lines  {outcome.warnings:,}", results)
    say(f"  load: before {outcome.load_before}; after {outcome.load_after}", results)
    for name, value in (
        ("runs", runs),
        ("completed", states.get("completed", 0)),
        ("error", error),
        ("failures", outcome.failure_count),
        ("expired", outcome.expired_in_queue),
        ("dispatches", outcome.dispatches),
        ("alerts", alerts),
        ("drain_s", outcome.drain_s),
        ("dead_max", dead_max),
    ):
        results.figures[f"overload {scenario.name} {name}"] = [float(value)]


def run_overload(quick: bool, results: Results) -> None:
    say(
        "Overload: the roles as `sasflow` processes at their default settings "
        f"(environment: {_role_environment()}); submissions published to <ns>.submit",
        results,
    )
    for scenario in scenarios(quick):
        say(scenario.describe(), results)
        outcome = overload_once(scenario)
        print_outcome(scenario, outcome, results)


def _role_environment() -> str:
    """The SASFLOW_* settings the roles inherit besides the scratch ones (none: defaults)."""
    own = {
        "SASFLOW_DATABASE_URL",
        "SASFLOW_BROKER_URL",
        "SASFLOW_NAMESPACE",
        "SASFLOW_APP",
        "SASFLOW_CHROMIUM",  # the test scripts' own variables: no role reads them
        "SASFLOW_SKIP_INSTALL",
        "SASFLOW_VENV",
    }
    given = sorted(k for k in os.environ if k.startswith("SASFLOW_") and k not in own)
    return ", ".join(f"{k}={os.environ[k]}" for k in given) or "no SASFLOW_* overrides"
