"""ratelimit: a rate limit of 50/s on one agent, held by 3 scheduler processes under a backlog
of 10,000 steps (issue 22's acceptance figure; docs/flow-control.md).

The backlog of one-step runs is submitted up front, held by a paused limit (concurrency 0)
while 3 `sasflow scheduler` processes and one `sasflow agent noop -c 16` (far more capacity
than 50/s needs) start and settle; then the limit is set to the rate through the operators'
service (the schedulers hear it by NOTIFY) and the window runs. The steps started are read
afterwards from their `dispatched_at` (database clock: the time the rate admitted them at).
Printed: the steps started in each whole second of the window, their mean, min and max, the
share of seconds within 5% of the limit, and the most started in any
1-second window (sliding, ending at each start), against what GCRA allows (burst + rate x 1 s).
The burst is small (5): after a pause of the claimers at most 5 steps start at once to catch
up."""

from __future__ import annotations

import statistics
import time

from sqlalchemy import Engine, text

from bench.apps import registry
from bench.common import Sizes, processes, scratch
from bench.report import Results, report, say, verdict
from sasflow import submit_run
from sasflow.ops import limits
from sasflow.store.flow.model import Limit
from sasflow.transport.topology import Names

RATE = 50.0
BURST = 5
"""A small burst: after a pause of the claimers (a loaded machine) at most this many steps start
at once to catch up, so each second stays near the rate."""
SCHEDULERS = 3
SETTLE = 3.0
"""Seconds for the roles to start before the window opens (their first claims included)."""


def _backlog(engine: Engine, names: Names, count: int) -> None:
    with engine.begin() as conn:
        for i in range(count):
            submit_run(conn, registry, "one", {"i": i}, key=f"rl-{i}", namespace=names.namespace)


def _limit(engine: Engine, names: Names, limit: Limit) -> None:
    with engine.begin() as conn:
        limits.set_limit(conn, limit, actor="bench", reason="bench", namespace=names.namespace)


def run_ratelimit(sizes: Sizes, results: Results) -> None:
    backlog, window = sizes.ratelimit_backlog, sizes.ratelimit_seconds
    burst = BURST
    say(
        f"ratelimit: {backlog:,} one-step runs up front, a limit of {RATE:g}/s (burst {burst}) on "
        f"their agent, {SCHEDULERS} scheduler processes and one agent of 16 threads; steps "
        f"started per second over {window:g} s (dispatched_at, database clock)",
        results,
    )
    with scratch("rl", ["noop"]) as (url, engine, names):
        started = time.perf_counter()
        _backlog(engine, names, backlog)
        _limit(engine, names, Limit("bench-rate", "noop", concurrency=0))  # paused meanwhile
        say(f"  backlog recorded in {time.perf_counter() - started:.1f}s", results)
        with processes(url, names, "bench.apps") as procs:
            procs.start("agent", "agent", "noop", "--concurrency", "16")
            for i in range(SCHEDULERS):
                procs.start(f"scheduler-{i}", "scheduler")
            time.sleep(SETTLE)  # the roles started and settled; the window opens
            _limit(engine, names, Limit("bench-rate", "noop", rate=RATE, burst=burst))
            time.sleep(window + 1.0)
            procs.assert_alive()
        with engine.connect() as conn:
            times = [
                float(t)
                for t in conn.execute(
                    text(
                        "SELECT extract(epoch FROM dispatched_at) FROM steps "
                        "WHERE dispatched_at IS NOT NULL ORDER BY dispatched_at"
                    )
                ).scalars()
            ]
    _figures(times, window, burst, results)


def _figures(times: list[float], window: float, burst: int, results: Results) -> None:
    if len(times) < 2:
        say("  FALL SHORT: no steps started", results)
        return
    first = times[0]
    # Whole seconds from the first start; the last, partial one left out.
    seconds = [0] * int(min(window, times[-1] - first))
    for t in times:
        index = int(t - first)
        if index < len(seconds):
            seconds[index] += 1
    steady = seconds[1:]  # the first second holds the initial burst
    say(f"  per second: {' '.join(str(n) for n in seconds)}", results)
    report(results, "ratelimit first second", [float(seconds[0])], "steps", f"burst {burst} + rate")
    report(
        results,
        "ratelimit steps/s after the first second",
        [statistics.mean(steady)],
        "steps/s",
        f"min {min(steady)}, max {max(steady)}, limit {RATE:g}/s",
    )
    within = sum(1 for n in steady if abs(n - RATE) <= 0.05 * RATE) / len(steady)
    report(
        results,
        "ratelimit seconds within 5% of the limit",
        [100 * within],
        "%",
        f"target 100%: {verdict(within == 1.0)}",
    )
    busiest = 0
    start = 0
    for end, t in enumerate(times):
        while times[start] <= t - 1.0:
            start += 1
        busiest = max(busiest, end - start + 1)
    bound = burst + RATE
    report(
        results,
        "ratelimit most in any 1-second window",
        [float(busiest)],
        "steps",
        f"GCRA allows at most burst + rate x 1 s = {bound:g}: {verdict(busiest <= bound)}",
    )
