"""The scheduler's latency for unrelated runs while a slow input builder is present.

    python bench/slow_builder.py [--runs 60] [--rate 10] [--builder 4]

Starts a scheduler and an agent (threads of this process, real PostgreSQL and RabbitMQ, a
scratch database and namespace) and submits one-step `quick` runs one at a time at `--rate`
runs/s, twice: alone, then with a `slow` run submitted every second whose second step's input
builder sleeps `--builder` seconds. The quick steps have 1 s clocks (timeout and wait), as in
the issue's report. Each quick run is timed from its `created_at` to its `finished_at`
(database clock). Prints, for each form, p50 and max in milliseconds, the quick steps that
counted a failure or were attempted more than once, and the handler calls per quick step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Engine, select

from bench.common import scratch, wait_until
from bench.report import percentile
from sasflow import Registry, Step, StepContext, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.store.schema import runs, steps
from tests import harness


def _app(builder_s: float, calls: Counter[str]) -> tuple[Registry, Agent]:
    svc = Agent("svc")
    lock = threading.Lock()

    @svc.handler("go")
    def go(call: Call) -> Any:
        with lock:
            calls[call.idempotency_key] += 1
        return {"ok": True}

    def slow_input(ctx: StepContext) -> Any:
        time.sleep(builder_s)
        return ctx.outputs["a"]

    tight = StepPolicy(timeout=1.0, wait_timeout=1.0, max_failures=3)
    slow = Workflow("slow", [Step("a", "svc", "go"), Step("b", "svc", "go", input=slow_input)])
    quick = Workflow("quick", [Step("only", "svc", "go", policy=tight)])
    return Registry([slow, quick], [svc]), svc


def _measure(engine: Engine, calls: Counter[str]) -> dict[str, Any]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                runs.c.created_at,
                runs.c.finished_at,
                steps.c.attempt,
                steps.c.failure_count,
                steps.c.idempotency_key,
            )
            .join(steps, steps.c.run_id == runs.c.id)
            .where(runs.c.workflow == "quick")
        ).all()
    latencies = [(r.finished_at - r.created_at).total_seconds() * 1000 for r in rows]
    return {
        "runs": len(rows),
        "p50": statistics.median(latencies),
        "p95": percentile(latencies, 0.95),
        "max": max(latencies),
        "failed": sum(r.failure_count > 0 for r in rows),
        "retried": sum(r.attempt > 1 for r in rows),
        "calls": sorted(Counter(calls[r.idempotency_key] for r in rows).items()),
    }


def once(quick_runs: int, rate: float, builder_s: float, *, slow: bool) -> dict[str, Any]:
    calls: Counter[str] = Counter()
    registry, agent = _app(builder_s, calls)
    with (
        scratch("slowb", ["svc"]) as (url, engine, names),
        harness.running(
            harness.scheduler(engine, url, registry, names), harness.agent(agent, names)
        ),
    ):
        time.sleep(1.0)
        next_slow = time.monotonic()
        for i in range(quick_runs):
            started = time.monotonic()
            if slow and started >= next_slow:
                with engine.begin() as conn:
                    submit_run(conn, registry, "slow", {}, key=f"s{i}", namespace=names.namespace)
                next_slow = started + 1.0
            with engine.begin() as conn:
                submit_run(conn, registry, "quick", {}, key=f"q{i}", namespace=names.namespace)
            time.sleep(max(0.0, 1 / rate - (time.monotonic() - started)))

        def quick_done() -> bool:
            with engine.connect() as conn:
                finished = conn.execute(
                    select(runs.c.id).where(
                        runs.c.workflow == "quick", runs.c.finished_at.is_not(None)
                    )
                ).all()
            return len(finished) >= quick_runs

        wait_until(quick_done, 120)
        return _measure(engine, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--builder", type=float, default=4.0)
    args = parser.parse_args()
    for slow in (False, True):
        figures = once(args.runs, args.rate, args.builder, slow=slow)
        form = f"with a {args.builder:g} s builder every 1 s" if slow else "alone"
        print(
            f"quick runs {form}: {figures['runs']} runs, end to end p50 {figures['p50']:.1f} ms, "
            f"p95 {figures['p95']:.1f} ms, max {figures['max']:.1f} ms; steps that counted a "
            f"failure {figures['failed']}, attempted twice or more {figures['retried']}; "
            f"handler calls per step (calls, steps) {figures['calls']}"
        )


if __name__ == "__main__":
    main()
