"""History retention at scale: prune 1M finished runs, alone and while W1 runs.

    python bench/prune.py [--runs 1000000] [--w1-runs 10000] [--batch 500]

In a scratch database on the server of SASFLOW_DATABASE_URL (default: the local PostgreSQL)
and a scratch namespace on SASFLOW_BROKER_URL: loads `--runs` runs finished 40 days ago (one
step and three events each, like a W1 run; generate_series, then ANALYZE: autovacuum may be
off), measures W1 (bench/run.py's drain: 2 schedulers + 2 agents as CLI processes) without a
prune, then again while a prune of every loaded run (`sasflow.ops.retention.prune`, batches of
`--batch`) runs in a thread, and reports the prune's throughput during W1 and alone after it.
Everything is dropped at the end. See docs/performance.md for the results.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Sizes, finished_steps, scratch
from bench.report import machine_line, say
from bench.workloads.drain import drain
from sasflow.ops.retention import PruneOptions, PruneReport, RetentionPolicy, prune
from sasflow.store.db import make_engine

LOAD = (
    """
INSERT INTO runs (workflow, version, business_key, input, state, created_at, updated_at,
                  finished_at)
SELECT 'one', 1, 'old-' || g, '{}'::jsonb,
       CASE WHEN g % 10 = 0 THEN 'error' ELSE 'completed' END,
       now() - interval '41 days', now() - interval '40 days',
       now() - interval '40 days' + g * interval '1 millisecond'
FROM generate_series(1, :runs) g;
"""
    + finished_steps("old-")
    + """INSERT INTO events (run_id, entity, step, from_state, to_state, attempt, actor, published)
SELECT r.id, e.entity, e.step, e.from_state, e.to_state, 1, 'bench', true
FROM runs r CROSS JOIN (VALUES ('step', 'only', 'pending', 'processing'),
                               ('step', 'only', 'processing', 'processed'),
                               ('run', NULL, 'running', 'completed'))
     AS e(entity, step, from_state, to_state)
WHERE r.business_key LIKE 'old-%';
ANALYZE runs; ANALYZE steps; ANALYZE events; ANALYZE alerts
"""
)


def load(engine: Engine, count: int) -> float:
    started = time.perf_counter()
    with engine.begin() as conn:
        for statement in LOAD.strip().split(";\n"):
            conn.execute(text(statement), {"runs": count})
    return time.perf_counter() - started


def old_runs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM runs WHERE business_key LIKE 'old-%'")
            ).scalar_one()
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--w1-runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    sizes = Sizes.of(quick=False)
    say(machine_line())
    with scratch("prune", ["noop"]) as (url, engine, names):
        took = load(engine, args.runs)
        say(f"loaded {args.runs:,} finished runs (+1 step, +3 events each) in {took:.1f}s")
        alone = drain(
            url, engine, names, "one", count=args.w1_runs, form="up-front", sizes=sizes
        ).rate
        say(f"W1 without prune: {alone:,.0f} runs/s ({args.w1_runs:,} runs)")

        pruner = make_engine(url, application_name="sasflow-bench-prune")
        result: list[PruneReport] = []
        times: dict[str, float] = {}

        def run_prune() -> None:
            times["start"] = time.perf_counter()
            result.append(
                prune(
                    pruner,
                    RetentionPolicy.older_than(30 * 86400),
                    actor="bench",
                    reason="bench",
                    options=PruneOptions(batch=args.batch),
                    collect_ids=False,
                )
            )
            times["end"] = time.perf_counter()

        thread = threading.Thread(target=run_prune)
        thread.start()
        during = drain(
            url, engine, names, "one", count=args.w1_runs, form="up-front", sizes=sizes
        ).rate
        w1_end = time.perf_counter()
        left_at_w1_end = old_runs(engine)
        thread.join()
        pruner.dispose()
        report = result[0]
        total = times["end"] - times["start"]
        in_w1 = args.runs - left_at_w1_end
        say(f"W1 during prune: {during:,.0f} runs/s ({during / alone:.0%} of W1 without prune)")
        say(
            f"prune: {report.pruned:,} runs in {report.batches:,} batches of {args.batch} in "
            f"{total:.1f}s = {report.pruned / total:,.0f} runs/s overall"
        )
        window = min(w1_end, times["end"]) - times["start"]
        if times["end"] <= w1_end:
            say(f"prune finished before W1 did: {report.pruned / total:,.0f} runs/s under W1")
        else:
            after = times["end"] - w1_end
            say(
                f"prune while W1 ran (first {window:.1f}s): {in_w1:,} runs = "
                f"{in_w1 / window:,.0f}/s; alone after: {left_at_w1_end:,} runs in {after:.1f}s"
                f" = {left_at_w1_end / max(after, 1e-9):,.0f}/s"
            )
        if old_runs(engine):
            raise SystemExit("the prune left loaded runs behind")


if __name__ == "__main__":
    main()
