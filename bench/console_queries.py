"""The console's reads on a big table: the runs text search and a workflow's charts.

    python bench/console_queries.py [--runs 100000] [--repeat 5]

In a scratch database on the server of SASFLOW_DATABASE_URL (default: the local PostgreSQL):
loads `--runs` finished runs spread over the last 7 days (one finished every
604800/runs seconds, 4 workflows, an input and an output of about 150 bytes of JSON each,
one step each; every 10th run failed with a step error), ANALYZE, then times (median of
`--repeat`) the first page (50) of a text search that matches nothing (the worst case: the
whole bounded scan), one that matches a word of one old run's step error, one that matches
many runs, the same with a workflow and a state, and the workflow series of each window and
the workflows' totals. Prints the plan of the search that matches nothing. Everything is
dropped at the end. See docs/performance.md for the results.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import scratch
from bench.report import machine_line, say
from sasflow.ops import workflows as workflow_ops
from sasflow.ops.runs import RunFilter, runs_page
from sasflow.store.db import run_transaction

LOAD = """
INSERT INTO runs (workflow, version, business_key, input, output, state, created_at,
                  updated_at, finished_at, error)
SELECT 'wf' || (g % 4), 1, 'order-' || g,
       jsonb_build_object('customer', 'c-' || (g % 977), 'items', jsonb_build_array(g % 7, g % 11),
                          'address', 'street ' || g || ', somewhere', 'note', md5(g::text)),
       CASE WHEN g % 10 = 0 THEN NULL
            ELSE jsonb_build_object('invoice', 'inv-' || g, 'total', g % 1000,
                                    'ref', md5((g * 7)::text)) END,
       CASE WHEN g % 10 = 0 THEN 'error' ELSE 'completed' END,
       now() - (g * :spacing + 10) * interval '1 second',
       now() - (g * :spacing) * interval '1 second',
       now() - (g * :spacing) * interval '1 second',
       CASE WHEN g % 10 = 0
            THEN jsonb_build_object('type', 'StepFailed', 'message', 'step only failed')
            ELSE NULL END
FROM generate_series(1, :runs) g;
INSERT INTO steps (run_id, name, kind, agent, action, depends_on, state, idempotency_key,
                   timeout_s, max_failures, backoff_initial_s, backoff_multiplier,
                   backoff_max_s, give_up_s, attempt, failure_count, input, output, error)
SELECT id, 'only', 'forward', 'remote', 'call', '[]'::jsonb,
       CASE WHEN state = 'error' THEN 'error' ELSE 'processed' END, md5(id::text),
       30, 3, 1, 2, 300, 86400, 1, 0, input, output,
       CASE WHEN state = 'error'
            THEN jsonb_build_object('type', 'PermanentError',
                                    'message', 'remote refused: code ' || (id % 50))
            ELSE NULL END
FROM runs;
UPDATE steps SET error = jsonb_build_object('type', 'PermanentError',
                                             'message', 'remote refused: quokka')
WHERE run_id = (SELECT min(id) + 1000 FROM runs WHERE state = 'error');
ANALYZE runs; ANALYZE steps
"""


def load(engine: Engine, count: int) -> float:
    started = time.perf_counter()
    spacing = 7 * 86400 / count
    with engine.begin() as conn:
        for statement in LOAD.strip().split(";\n"):
            conn.execute(text(statement), {"runs": count, "spacing": spacing})
    return time.perf_counter() - started


def timed(engine: Engine, repeat: int, work: Callable[[Any], Any]) -> tuple[float, Any]:
    """The median wall time of `work` in a transaction, ms, and its last answer."""
    took = []
    answer = None
    for _ in range(repeat):
        started = time.perf_counter()
        answer = run_transaction(engine, work)
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took), answer


def search(where: RunFilter) -> Callable[[Any], Any]:
    return lambda conn: runs_page(conn, where, cursor=None)[0]


def charting(window: workflow_ops.Window) -> Callable[[Any], Any]:
    return lambda conn: workflow_ops.series(conn, "wf1", window)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    say(machine_line())
    with scratch("console", []) as (_, engine, _names):
        say(f"loaded {args.runs} runs with their steps in {load(engine, args.runs):.1f} s")
        cases = [
            ("text, no match (the whole bounded scan)", RunFilter(text="zzz-none", limit=50)),
            ("text, one old run's step error", RunFilter(text="QUOKKA", limit=50)),
            ("text, many matches (first page)", RunFilter(text="refused", limit=50)),
            (
                "text + workflow + state, no match",
                RunFilter(text="zzz-none", workflow="wf1", states=("error",), limit=50),
            ),
            ("no text (the plain first page)", RunFilter(limit=50)),
        ]
        for label, where in cases:
            ms, found = timed(engine, args.repeat, search(where))
            say(f"{label}: {ms:.1f} ms, {len(found)} run(s)")
        for window in workflow_ops.WINDOWS:
            ms, series = timed(engine, args.repeat, charting(window))
            finished = sum(b.finished for b in series.buckets)
            say(f"series wf1 {window.name}: {ms:.1f} ms, {finished} runs in the window")
        ms, rows = timed(engine, args.repeat, lambda conn: workflow_ops.totals(conn, []))
        say(f"totals: {ms:.1f} ms, {len(rows)} workflows")
        with engine.connect() as conn:
            compiled = search_sql(engine, RunFilter(text="zzz-none", limit=50))
            plan = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {compiled}"))
            for (line,) in plan:
                say(f"  {line}")


def search_sql(engine: Engine, where: RunFilter) -> str:
    """The search's statement with its values inlined, for EXPLAIN."""
    from sqlalchemy import select  # noqa: PLC0415 - only for the plan

    from sasflow.store.operator.inspect import _RUN_COLUMNS, _conditions  # noqa: PLC0415
    from sasflow.store.schema import runs  # noqa: PLC0415

    query = (
        select(*_RUN_COLUMNS)
        .where(*_conditions(where))
        .order_by(runs.c.id.desc())
        .limit(where.limit)
    )
    return str(query.compile(engine, compile_kwargs={"literal_binds": True}))


if __name__ == "__main__":
    main()
