"""W3: submit-to-completion latency of one-step runs submitted one at a time.

A scheduler and an agent run as threads of the bench process (real PostgreSQL and RabbitMQ);
one run at a time is submitted with `submit_run` in its own transaction at a fixed rate. Each
run is timed from just before its submitting transaction to
- "observed": the arrival of its `run.completed` status event on a queue bound to the status
  exchange (the client learns of the completion through the system itself);
- "body": the start of the step's handler (the agent is a thread here, so the handler records
  `time.perf_counter()` on the same clock).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pika

from bench.common import Sizes, scratch, wait_until
from bench.report import Results, percentile, report, say, verdict
from bench.workloads.w0 import RR1_P50
from sasflow import Registry, Step, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.hooks import Hooks
from tests import harness, services

if TYPE_CHECKING:
    from bench.stages import Stages


@dataclass
class Latencies:
    observed: list[float]
    """Milliseconds from submit to the `run.completed` event, one per run observed."""
    body: list[float]
    """Milliseconds from submit to the start of the step's handler."""


def build_registry(started: dict[int, float]) -> tuple[Registry, Agent]:
    """The `one` workflow with a handler that records when it starts, by run id."""
    noop = Agent("noop")

    @noop.handler("nothing")
    def nothing(call: Call) -> None:
        started.setdefault(call.run_id, time.perf_counter())

    return Registry([Workflow("one", [Step("only", "noop", "nothing")])], [noop]), noop


def latency_once(
    sizes: Sizes,
    hooks: Callable[[str], Hooks | None] = lambda _role: None,
    *,
    schedulers: int = 1,
    submitter: bool = False,
    stages: Stages | None = None,
) -> Latencies:
    """One W3 measurement; `hooks(role)` gives the scheduler's and the agent's hooks
    (bench/overhead.py). `schedulers` and `submitter`: more relays (issue 26's topology: two
    schedulers and a submitter relaying events, bench/w3_relays.py); the runs are still
    submitted by the bench itself. `stages`: stamp each stage of the path (bench/stages.py;
    it is then the schedulers' hooks)."""
    handled: dict[int, float] = {}
    registry, agent = build_registry(handled)
    runs = int(sizes.w3_seconds * sizes.w3_rate)
    with scratch("w3", ["noop"]) as (url, engine, names):
        queue = harness.bind_status_queue(names, "one.run.completed")
        completions: dict[int, float] = {}
        submitted: dict[int, float] = {}
        done = threading.Event()

        def listen() -> None:
            connection = pika.BlockingConnection(pika.URLParameters(services.broker_url()))
            channel = connection.channel()
            for _method, _props, body in channel.consume(
                queue, auto_ack=True, inactivity_timeout=0.05
            ):
                if body is not None:
                    completions[json.loads(body)["run_id"]] = time.perf_counter()
                if done.is_set():
                    break
            connection.close()

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        try:
            scheduler_hooks = stages if stages is not None else hooks("scheduler")
            scheds = [
                harness.scheduler(engine, url, registry, names, scheduler_hooks)
                for _ in range(schedulers)
            ]
            if stages is not None:
                for sched in scheds:
                    stages.attach(sched)
            roles: list[harness.Role] = [
                *scheds,
                harness.agent(agent, names, hooks=hooks("agent")),
                *([harness.submitter(engine, registry, names)] if submitter else []),
            ]
            with harness.running(*roles):
                time.sleep(1.0)
                for i in range(runs):
                    if stages is not None:
                        stages.begin()
                    started = time.perf_counter()
                    with engine.begin() as conn:
                        run = submit_run(
                            conn, registry, "one", {"i": i}, key=f"r{i}", namespace=names.namespace
                        )
                    submitted[run.run_id] = started
                    time.sleep(max(0.0, 1 / sizes.w3_rate - (time.perf_counter() - started)))
                wait_until(lambda: len(completions) >= runs, 30)
        finally:
            done.set()
            listener.join(5)
    if stages is not None:
        for index, run_id in enumerate(submitted):
            for stage, stamps in (("handler", handled), ("observed", completions)):
                if run_id in stamps:
                    stages.add(index, stage, stamps[run_id])
    observed = [(completions[r] - submitted[r]) * 1000 for r in submitted if r in completions]
    body = [(handled[r] - submitted[r]) * 1000 for r in submitted if r in handled]
    if len(observed) < runs:
        say(f"    only {len(observed)}/{runs} completions observed")
    return Latencies(observed, body)


def run_w3(sizes: Sizes, results: Results) -> None:
    say(
        f"W3: one one-step run at a time at {sizes.w3_rate:g}/s for {sizes.w3_seconds:g}s "
        "(scheduler + agent threads); observed = submit -> run.completed status event, "
        "body = submit -> the step's handler starts",
        results,
    )
    figures: dict[str, list[float]] = {}
    for _ in range(sizes.repeat):
        measured = latency_once(sizes)
        for kind, values in (("observed", measured.observed), ("body", measured.body)):
            for q, label in ((0.50, "p50"), (0.95, "p95"), (0.99, "p99")):
                value = statistics.median(values) if q == 0.50 else percentile(values, q)
                figures.setdefault(f"W3 {kind} {label}", []).append(value)
    rr1 = results.median(RR1_P50)
    p50 = statistics.median(figures["W3 observed p50"])
    trips = f"= {p50 / rr1:.1f} rr1 round trips (p50 {rr1:.2f} ms); " if rr1 else ""
    targets = {
        "W3 observed p50": (5.0, trips),
        "W3 observed p99": (10.0, ""),
        "W3 body p50": (3.0, ""),
    }
    for name, values in figures.items():
        extra = ""
        if name in targets:
            limit, prefix = targets[name]
            extra = f"{prefix}target <= {limit:g} ms: {verdict(statistics.median(values) <= limit)}"
        report(results, name, values, "ms", extra)
