"""The cost of observability: W1 and W3 with metrics, tracing and both on, against off.

    python bench/overhead.py [--quick] [--repeat N] [--runs N] [--settings off,metrics] [--no-w3]

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
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Sizes, scratch
from bench.hook_cost import cost_per_run
from bench.report import Results, load_line, report, say, verdict
from bench.workloads.drain import drain
from bench.workloads.w3 import latency_once
from sasflow.hooks import Hooks
from sasflow.observability.build import role_hooks
from sasflow.settings import Settings

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


def rotated(index: int, settings: tuple[str, ...] = SETTINGS) -> tuple[str, ...]:
    """`settings`, starting one further on each repeat: none always runs first (cold caches)."""
    shift = index % len(settings)
    return settings[shift:] + settings[:shift]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--repeat", type=int, default=None, help="override the repeat count")
    parser.add_argument("--runs", type=int, default=None, help="override W1's run count")
    parser.add_argument(
        "--settings",
        default=",".join(SETTINGS),
        help=f"comma-separated, `off` first (default {','.join(SETTINGS)})",
    )
    parser.add_argument("--no-w3", action="store_true", help="W1 only")
    args = parser.parse_args()
    sizes = Sizes.of(args.quick)
    if args.repeat:
        sizes.repeat = args.repeat
    if args.runs:
        sizes.w1_runs = args.runs
    chosen = tuple(args.settings.split(","))
    if chosen[0] != "off" or not set(chosen) <= set(SETTINGS):
        parser.error(f"--settings: `off` first, then any of {', '.join(SETTINGS[1:])}")
    results = Results()
    say(load_line(), results)
    w1: dict[str, list[float]] = {s: [] for s in chosen}
    w1_cpu: dict[str, list[float]] = {s: [] for s in chosen}
    w3: dict[str, list[float]] = {s: [] for s in chosen}
    with tempfile.TemporaryDirectory(prefix="sasflow-overhead-") as scratch_dir:
        spans = Path(scratch_dir) / "spans.jsonl"
        with scratch("ovh", ["noop"]) as (url, engine, names):
            for index in range(sizes.repeat):
                for setting in rotated(index, chosen):
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
                    say(
                        f"  round {index + 1} {setting}: {drained.rate:.0f} runs/s, "
                        f"{w1_cpu[setting][-1]:.3f} ms CPU per run; {load_line()}"
                    )
        if not args.no_w3:
            _w3(sizes, chosen, spans, w3)
    _print(results, sizes, chosen=chosen, w1=w1, w1_cpu=w1_cpu, w3=None if args.no_w3 else w3)


def _w3(sizes: Sizes, chosen: tuple[str, ...], spans: Path, w3: dict[str, list[float]]) -> None:
    for index in range(sizes.repeat):
        for setting in rotated(index, chosen):
            values = variables(setting, spans)
            make, made = hooks_of(values, "bench")
            try:
                with environment(values):  # the SDK reads its sampler variables
                    latencies = latency_once(sizes, make).observed
            finally:
                for hooks in made:
                    hooks.close()
            w3[setting].append(statistics.median(latencies))


def _print(
    results: Results,
    sizes: Sizes,
    *,
    chosen: tuple[str, ...],
    w1: dict[str, list[float]],
    w1_cpu: dict[str, list[float]],
    w3: dict[str, list[float]] | None,
) -> None:
    say(f"W1 ({sizes.w1_runs:,} one-step runs, CLI processes) by setting", results)
    base = statistics.median(w1["off"])
    for setting in chosen:
        cost = 1 - statistics.median(w1[setting]) / base
        target = TARGETS.get(setting)
        extra = f"cost {cost:+.1%} of off" + (
            f"; target <= {target:.0%}: {verdict(cost <= target)}" if target else ""
        )
        report(results, f"W1 runs/s {setting}", w1[setting], "runs/s", extra)
    say("W1 CPU of the 4 role processes per run (less sensitive to the machine's load)", results)
    base = statistics.median(w1_cpu["off"])
    for setting in chosen:
        cost = statistics.median(w1_cpu[setting]) / base - 1
        target = TARGETS.get(setting)
        extra = f"{cost:+.1%} of off" + (
            f"; target <= {target:.0%}: {verdict(cost <= target)}" if target else ""
        )
        report(results, f"W1 CPU/run {setting}", w1_cpu[setting], "ms", extra, fmt=".2f")
    say("W1 CPU per run against `off` of the same round (paired: the load moves less)", results)
    for setting in chosen[1:]:
        paired = [c / o - 1 for c, o in zip(w1_cpu[setting], w1_cpu["off"], strict=True)]
        rounds = ", ".join(f"{r:+.1%}" for r in paired)
        say(f"  {setting}: median {statistics.median(paired):+.1%} (rounds: {rounds})", results)
    if w3 is not None:
        say("W3 latency p50 (one run at a time, roles as threads) by setting", results)
        base = statistics.median(w3["off"])
        for setting in chosen:
            ratio = statistics.median(w3[setting]) / base
            report(results, f"W3 p50 {setting}", w3[setting], "ms", f"x{ratio:.2f} of off")
    say(
        f"metrics hooks, called directly (bench/hook_cost.py, one run per batch): "
        f"{cost_per_run(metrics_on=True):.1f} us of CPU per one-step run",
        results,
    )
    say(load_line(), results)


if __name__ == "__main__":
    main()
