"""The cost of observability: W1 and W3 with metrics, tracing and both on, against off.

    python bench/overhead.py [--quick] [--repeat N]

Runs bench/run.py's W1 (one-step runs drained by 2 schedulers + 2 agents, CLI processes) and
W3 (one run at a time, submit commit -> run.completed, roles as threads) once per setting per
repeat, the settings interleaved so that a change in the machine's load spreads over all of
them. Prints each figure and its ratio to `off` measured in the same run (targets: metrics
cost <= 3 % of W1 throughput, tracing <= 10 %), and the CPU time the four role processes spent
per run during the W1 drain, which a loaded shared machine disturbs far less than throughput.
Spans go to a scratch file; metrics are served on a free port and not scraped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Sizes, scratch
from bench.report import Results, load_line, report, say, verdict
from bench.workloads.drain import drain
from bench.workloads.w3 import latency_once
from sasflow.commands import FinishedRun
from sasflow.hooks import Hooks
from sasflow.messages import Reply, Request
from sasflow.observability import exposition, metrics
from sasflow.observability.build import role_hooks
from sasflow.settings import Settings
from sasflow.states import RunState
from sasflow.store.runs.apply import ApplyReport

SETTINGS = ("off", "metrics", "tracing", "tracing-10%", "both")
TARGETS = {"metrics": 0.03, "tracing": 0.10}


def variables(setting: str, spans: Path) -> dict[str, str]:
    """The environment of `setting`: tracing records every run, tracing-10% one in ten (the
    OpenTelemetry SDK's own sampler variables; the decision follows the run's root)."""
    found = {}
    if setting in ("metrics", "both"):
        found["SASFLOW_METRICS_PORT"] = "0"
    if setting.startswith("tracing") or setting == "both":
        found["SASFLOW_TRACE_FILE"] = str(spans)
    if setting == "tracing-10%":
        found["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        found["OTEL_TRACES_SAMPLER_ARG"] = "0.1"
    return found


def rotated(index: int) -> tuple[str, ...]:
    """SETTINGS, starting one further on each repeat: none always runs first (cold caches)."""
    shift = index % len(SETTINGS)
    return SETTINGS[shift:] + SETTINGS[:shift]


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """The CLI processes started meanwhile inherit `values` (Processes copies os.environ)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def hooks_of(values: dict[str, str], namespace: str) -> tuple[Callable[[str], Hooks], list[Hooks]]:
    made: list[Hooks] = []

    def make(role: str) -> Hooks:
        settings = Settings(
            namespace=namespace,
            metrics_port=int(values["SASFLOW_METRICS_PORT"])
            if "SASFLOW_METRICS_PORT" in values
            else None,
            trace_file=values.get("SASFLOW_TRACE_FILE"),
        )
        made.append(role_hooks(settings, role))
        return made[-1]

    return make, made


def metrics_cost_per_run(runs: int = 20_000) -> float:
    """Microseconds of CPU the metrics hooks of a scheduler and an agent spend on one one-step
    run (every event a run causes, called directly: no I/O, so the machine's load barely
    matters)."""
    scheduler = metrics.SchedulerMetrics(exposition.new_registry())
    agent = metrics.AgentMetrics(exposition.new_registry())
    request = Request(
        step_id=1,
        run_id=1,
        attempt=1,
        workflow="one",
        step="only",
        agent="noop",
        action="nothing",
        idempotency_key="k",
        budget_ms=1000,
        complete_by="2026-01-01T00:00:00+00:00",
    )
    reply = Reply(step_id=1, attempt=1, status="ok")
    report = ApplyReport(applied=1, finished={1: FinishedRun(RunState.COMPLETED, "one")})
    held: list[Any] = [(None, reply)]
    started = time.process_time()
    for _ in range(runs):
        scheduler.steps_claimed(None, held, 0.001)  # type: ignore[arg-type]
        scheduler.steps_dispatched(1, 0.001)
        agent.handler_finished(request, reply, 0.001, None)
        scheduler.replies_applied(held, report, 0.001)
        scheduler.runs_finished(None, report.finished)  # type: ignore[arg-type]
        scheduler.events_relayed(2, 0.001)
    return (time.process_time() - started) / runs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--repeat", type=int, default=None, help="override the repeat count")
    args = parser.parse_args()
    sizes = Sizes.of(args.quick)
    if args.repeat:
        sizes.repeat = args.repeat
    results = Results()
    w1: dict[str, list[float]] = {s: [] for s in SETTINGS}
    w1_cpu: dict[str, list[float]] = {s: [] for s in SETTINGS}
    w3: dict[str, list[float]] = {s: [] for s in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="sasflow-overhead-") as scratch_dir:
        spans = Path(scratch_dir) / "spans.jsonl"
        with scratch("ovh", ["noop"]) as (url, engine, names):
            for index in range(sizes.repeat):
                for setting in rotated(index):
                    values = variables(setting, spans)
                    with environment(values):
                        drained = drain(
                            url,
                            engine,
                            names,
                            "one",
                            count=sizes.w1_runs,
                            form="up-front",
                            sizes=sizes,
                        )
                    w1[setting].append(drained.rate)
                    w1_cpu[setting].append(sum(drained.cpu.values()) * 1000 / drained.count)
        for index in range(sizes.repeat):
            for setting in rotated(index):
                values = variables(setting, spans)
                make, made = hooks_of(values, "bench")
                try:
                    with environment(values):  # the SDK reads its sampler variables
                        latencies = latency_once(sizes, make).observed
                finally:
                    for hooks in made:
                        hooks.close()
                w3[setting].append(statistics.median(latencies))
    say(f"W1 ({sizes.w1_runs:,} one-step runs, CLI processes) by setting", results)
    base = statistics.median(w1["off"])
    for setting in SETTINGS:
        cost = 1 - statistics.median(w1[setting]) / base
        target = TARGETS.get(setting)
        extra = f"cost {cost:+.1%} of off" + (
            f"; target <= {target:.0%}: {verdict(cost <= target)}" if target else ""
        )
        report(results, f"W1 runs/s {setting}", w1[setting], "runs/s", extra)
    say("W1 CPU of the 4 role processes per run (less sensitive to the machine's load)", results)
    base = statistics.median(w1_cpu["off"])
    for setting in SETTINGS:
        cost = statistics.median(w1_cpu[setting]) / base - 1
        target = TARGETS.get(setting)
        extra = f"{cost:+.1%} of off" + (
            f"; target <= {target:.0%}: {verdict(cost <= target)}" if target else ""
        )
        report(results, f"W1 CPU/run {setting}", w1_cpu[setting], "ms", extra, fmt=".2f")
    say("W3 latency p50 (one run at a time, roles as threads) by setting", results)
    base = statistics.median(w3["off"])
    for setting in SETTINGS:
        ratio = statistics.median(w3[setting]) / base
        report(results, f"W3 p50 {setting}", w3[setting], "ms", f"x{ratio:.2f} of off")
    say(
        f"metrics hooks, called directly: {metrics_cost_per_run():.1f} us of CPU per one-step run",
        results,
    )
    say(load_line(), results)


if __name__ == "__main__":
    main()
