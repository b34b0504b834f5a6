"""W1 and W2: one-step and three-step runs drained by the roles as CLI processes, in the forms
of bench/workloads/submit.py, repeats interleaved so that a change of the machine's load
spreads over every form. Ratios to the 8-in-flight request/reply rate of the same run."""

from __future__ import annotations

import statistics
import time

from sqlalchemy import Engine, text

from bench.common import Sizes, analyze, autovacuum, finished_steps, scratch
from bench.report import Results, ratio, report, say, verdict
from bench.workloads.drain import Drain, drain
from bench.workloads.w0 import RR8
from sasflow.ops import limits
from sasflow.store.flow.model import Limit
from sasflow.transport.topology import Names

FORMS = {
    "W1": ("one", "up-front"),
    "W1c": ("one", "concurrent"),
    "W1s": ("one", "broker"),
    "W2": ("three", "up-front"),
    "W2c": ("three", "concurrent"),
}
"""Workload name -> (workflow of bench/apps.py, form of bench/workloads/drain.py)."""
TITLE = {"one": "one-step", "three": "three-step"}
HISTORY_RUNS = 1_000
HISTORY = (
    """
INSERT INTO runs (workflow, version, business_key, input, output, state, created_at, updated_at,
                  finished_at)
SELECT 'one', 1, 'history-' || g, '{}'::jsonb, '{}'::jsonb, 'completed',
       now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series(1, :runs) g;
"""
    + finished_steps("history-")
    + """INSERT INTO events (run_id, entity, step, from_state, to_state, attempt, actor, published)
SELECT r.id, e.entity, e.step, e.from_state, e.to_state, 1, 'bench', true
FROM runs r CROSS JOIN (VALUES ('run', NULL, 'pending', 'running'),
                               ('step', 'only', 'pending', 'processing'),
                               ('step', 'only', 'processing', 'processed'),
                               ('run', NULL, 'running', 'completed'))
     AS e(entity, step, from_state, to_state)
WHERE r.business_key LIKE 'history-%'
"""
)


FLOW_LIMITS = ("none", "other", "generous")
_DEFINED = {
    "none": [],
    "other": [Limit("elsewhere", "other-agent", rate=10.0)],
    "generous": [
        Limit("noop-rate", "noop", rate=1_000_000.0),
        Limit("noop-at-once", "noop", concurrency=1_000_000),
    ],
}


def define_limits(engine: Engine, names: Names, which: str, results: Results) -> None:
    """Set the flow limits `which` (FLOW_LIMITS) through the operators' service."""
    with engine.begin() as conn:
        for limit in _DEFINED[which]:
            limits.set_limit(conn, limit, actor="bench", reason="bench", namespace=names.namespace)
    if which != "none":
        defined = ", ".join(
            f"{lim.name} on {lim.agent} {lim.describe()}" for lim in _DEFINED[which]
        )
        say(f"  flow limits: {defined}", results)


def load_history(engine: Engine, results: Results) -> None:
    """Give the scratch database a history of finished one-step runs before the first form,
    as a production server has: otherwise the first form drains into empty tables (and the
    ones after it into the runs of the forms before), which favours no form equally."""
    started = time.perf_counter()
    analyzed = ""
    with engine.begin() as conn:
        for statement in HISTORY.strip().split(";\n"):
            conn.execute(text(statement), {"runs": HISTORY_RUNS})
        if not autovacuum(engine):
            analyzed = f", then ANALYZE {analyze(conn) * 1000:.0f} ms: autovacuum is off"
    say(
        f"  history: {HISTORY_RUNS:,} finished one-step runs loaded first "
        f"({time.perf_counter() - started:.1f}s{analyzed})",
        results,
    )


def _describe(name: str, sizes: Sizes) -> str:
    workflow, form = FORMS[name]
    count = sizes.w1_runs if workflow == "one" else sizes.w2_runs
    what = f"{count:,} {TITLE[workflow]} runs"
    if form == "up-front":
        return f"{name}: {what} submitted up front with submit_run (one commit), then drained"
    if form == "concurrent":
        return (
            f"{name}: {what} submitted while they drain by {sizes.clients} application client "
            "processes, one run per transaction with submit_run (processes: threads would share "
            "one interpreter lock that applications do not)"
        )
    return (
        f"{name}: {what} published one message each to <ns>.submit (persistent, confirmed) "
        "while they drain, recorded by a `sasflow submitter` process"
    )


def _cpu_lines(results: Results, name: str, drains: list[Drain]) -> None:
    for role in ("scheduler", "agent"):
        report(
            results,
            f"{name} {role} CPU per step",
            [d.cpu_ms(role, d.steps) for d in drains],
            "ms",
            fmt=".2f",
        )


def _report(results: Results, name: str, drains: list[Drain], rr8: float | None) -> None:
    workflow, form = FORMS[name]
    rates = [d.rate for d in drains]
    if form == "broker":
        base = results.median("W1c one-step runs/s")
        extra = ratio(statistics.median(rates), base, f"W1c ({base or 0:.0f}/s)", 0.80)
    elif workflow == "one":
        extra = ratio(statistics.median(rates), rr8, f"rr8 ({rr8 or 0:.0f}/s)", 0.40)
    else:
        third = rr8 / 3 if rr8 else None
        extra = ratio(statistics.median(rates), third, f"rr8/3 ({third or 0:.0f}/s)", 0.40)
    report(results, f"{name} {TITLE[workflow]} runs/s", rates, "runs/s", extra)
    if form == "concurrent":
        report(results, f"{name} submissions/s", [d.submit_rate for d in drains], "runs/s")
        report(
            results,
            f"{name} client CPU per submission",
            [d.client_cpu_ms or float("nan") for d in drains],
            "ms",
            fmt=".2f",
        )
    if form == "broker":
        base = results.median("W1c submissions/s")
        rate = [d.submit_rate for d in drains]
        share = f"= {statistics.median(rate) / base:.0%} of W1c's" if base else ""
        report(results, f"{name} submissions/s", rate, "runs/s", share)
        report(
            results,
            f"{name} submitter CPU per submission",
            [d.cpu_ms("submitter", d.count) for d in drains],
            "ms",
            fmt=".2f",
        )
    _cpu_lines(results, name, drains)
    if name == "W1":
        scheduler = [d.memory["scheduler"] for d in drains]
        report(
            results,
            "W1 scheduler peak RSS",
            scheduler,
            "MB",
            f"target <= 150 MB: {verdict(max(scheduler) <= 150)}",
        )
        report(results, "W1 agent peak RSS", [d.memory["agent"] for d in drains], "MB")


def run_w12(sizes: Sizes, results: Results, which: set[str]) -> None:
    chosen = [name for name in FORMS if name in which]
    say(
        "W1/W2: runs drained by 2 schedulers + 2 agents x 4 threads (CLI processes); repeats "
        f"interleaved ({', '.join(chosen)}); runs/s from the first submission to the last "
        "finished_at (database clock); CPU per step = utime+stime of the role's processes over "
        "the drain / steps completed",
        results,
    )
    for name in chosen:
        say(f"  {_describe(name, sizes)}", results)
    drains: dict[str, list[Drain]] = {name: [] for name in chosen}
    with scratch("w12", ["noop"]) as (url, engine, names):
        load_history(engine, results)
        define_limits(engine, names, sizes.flow_limits, results)
        for index in range(sizes.repeat):
            for name in chosen:
                workflow, form = FORMS[name]
                count = sizes.w1_runs if workflow == "one" else sizes.w2_runs
                say(f"  {name} repeat {index + 1}/{sizes.repeat}")
                drains[name].append(
                    drain(url, engine, names, workflow, count=count, form=form, sizes=sizes)
                )
    rr8 = results.median(RR8)
    for name in chosen:
        _report(results, name, drains[name], rr8)
