"""What parked steps cost the operators' reads: the runs list with its `parked` column, and
`runs list --parked`.

    python bench/park.py [--runs 100000] [--parked-every 100] [--repeat 5]

In a scratch database on the server of SASFLOW_DATABASE_URL (default: the local PostgreSQL):
loads `--runs` finished runs as bench/console_queries.py does (one step each), then makes
every `--parked-every`th run `running` with its step `parked`; ANALYZE; then times (median of
`--repeat`) the first page (50) of the runs list as the code reads it (with the `parked`
column, an EXISTS on the partial index ix_steps_parked per run listed) and without that
column (the list as it was before parking), the first page of `--parked`, and unparking then
parking again one run (ops.park.unpark_run, in one transaction). Prints the plan of the
`--parked` page. Everything is dropped at the end. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import scratch
from bench.console_queries import load, timed
from bench.report import machine_line, say
from sasflow.ops import park
from sasflow.ops.runs import RunFilter, runs_page
from sasflow.store.operator.inspect import _RUN_COLUMNS, _conditions
from sasflow.store.schema import runs

PARK = """
UPDATE runs SET state = 'running', finished_at = NULL WHERE id % :every = 0;
UPDATE steps SET state = 'parked', failure_count = 3, attempt = 3,
       error = jsonb_build_object('type', 'ConnectionError', 'message', 'partner down')
WHERE run_id % :every = 0;
ANALYZE runs; ANALYZE steps
"""


def park_some(engine: Engine, every: int) -> int:
    with engine.begin() as conn:
        for statement in PARK.strip().split(";\n"):
            conn.execute(text(statement), {"every": every})
        return int(
            conn.execute(text("SELECT count(*) FROM steps WHERE state = 'parked'")).scalar_one()
        )


def page(where: RunFilter) -> Any:
    return lambda conn: runs_page(conn, where, cursor=None)[0]


def page_without_parked_column(conn: Any) -> Any:
    """The first page as it was read before parking: the same columns less `parked`."""
    query = select(*_RUN_COLUMNS[:-1]).order_by(runs.c.id.desc()).limit(50)
    return conn.execute(query).all()


def unpark_and_park_again(run_id: int) -> Any:
    def work(conn: Any) -> Any:
        done = park.unpark_run(conn, run_id, actor="bench", reason="bench", namespace="bench")
        conn.execute(text("UPDATE steps SET state = 'parked' WHERE run_id = :id"), {"id": run_id})
        return done

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--parked-every", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    say(machine_line())
    with scratch("park", []) as (_, engine, _names):
        say(f"loaded {args.runs} runs with their steps in {load(engine, args.runs):.1f} s")
        say(f"parked {park_some(engine, args.parked_every)} step(s)")
        cases = [
            ("runs list, first page (with the parked column)", page(RunFilter(limit=50))),
            ("runs list, first page (without it, as before)", page_without_parked_column),
            ("runs list --parked, first page", page(RunFilter(parked=True, limit=50))),
            (
                "runs list --parked --workflow wf0 --state running, first page",
                page(RunFilter(parked=True, workflow="wf0", states=("running",), limit=50)),
            ),
        ]
        for label, work in cases:
            ms, found = timed(engine, args.repeat, work)
            say(f"{label}: {ms:.2f} ms, {len(found)} run(s)")
        ms, done = timed(engine, args.repeat, unpark_and_park_again(args.parked_every))
        say(f"unpark one run (and park it again): {ms:.2f} ms, {done['steps']}")
        where = _conditions(RunFilter(parked=True))
        query = select(*_RUN_COLUMNS).where(*where).order_by(runs.c.id.desc()).limit(50)
        compiled = str(query.compile(engine, compile_kwargs={"literal_binds": True}))
        with engine.connect() as conn:
            plan = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {compiled}"))
            for (line,) in plan:
                say(f"  {line}")


if __name__ == "__main__":
    main()
