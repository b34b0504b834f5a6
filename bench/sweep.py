"""Supervisor sweep time on a large steps table: does it grow with the table?

    python bench/sweep.py [--rows 1000000 100000] [--expired 1000] [--repeat 3] [--started 1]

Creates a scratch database per size on the server of SASFLOW_DATABASE_URL (default: the local
PostgreSQL), fills `steps` with mostly finished rows plus `--expired` processing steps whose
deadline passed, then times the supervisor's full sweep (lease check, the batched
SKIP LOCKED statement, events) `--repeat` times. Prints the median and the range. Durability
settings are the server's (fsync and synchronous_commit as configured).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sasflow.store import migrate
from sasflow.store.cluster.lease import SUPERVISOR_LEASE, Lease
from sasflow.store.db import make_engine
from sasflow.store.runs.sweeps import SweepReport
from sasflow.supervisor.sweep import sweep_expired
from tests import services

FILL = """
INSERT INTO runs (workflow, version, business_key, input, state)
SELECT 'bench', 1, 'k' || g, '{}'::jsonb, 'running' FROM generate_series(1, :runs) g;
INSERT INTO steps (run_id, name, kind, agent, action, depends_on, state, idempotency_key,
                   timeout_s, max_failures, backoff_initial_s, backoff_multiplier,
                   backoff_max_s, give_up_s, attempt, failure_count)
SELECT r.id, 's' || g, 'forward', 'bench', 'act', '[]'::jsonb, 'processed', md5(g::text),
       30, 1000000, 1, 2, 300, 86400, 1, 0
FROM generate_series(1, :rows) g JOIN runs r ON r.business_key = 'k' || (1 + g % :runs);
ANALYZE runs; ANALYZE steps;
"""

EXPIRE = """
UPDATE steps SET state = 'processing', locked_by = 'bench', attempt = attempt + 1,
       complete_by = now() - interval '1 minute',
       started_at = CASE WHEN random() < :started THEN now() - interval '2 minutes' END
WHERE id IN (SELECT id FROM steps ORDER BY random() LIMIT :expired)
"""
"""Expired steps, a share `started` of them started by an agent (execution clock: a failure
counted), the others never started (wait clock: pending again, uncharged)."""


def measure(rows: int, expired: int, repeat: int, started_share: float = 1.0) -> list[float]:
    name = services.unique("sasflow_bench_sweep")
    services.create_database(name)
    engine = make_engine(services.database_url(name))
    try:
        migrate.upgrade(engine)
        started = time.monotonic()
        with engine.begin() as conn:
            for statement in FILL.strip().split(";\n"):
                conn.execute(text(statement), {"rows": rows, "runs": max(1, rows // 10)})
        print(f"  filled {rows:,} steps in {time.monotonic() - started:.1f}s", flush=True)
        lease = Lease("bench", name=SUPERVISOR_LEASE, ttl=600)
        timings = []
        for _ in range(repeat):
            with engine.begin() as conn:
                conn.execute(text(EXPIRE), {"expired": expired, "started": started_share})
            if not lease.acquire(engine):
                raise SystemExit("could not take the supervisor lease of the scratch database")
            report = SweepReport()
            started = time.monotonic()
            sweep_expired(
                engine, lease, batch=500, budget=60, actor="bench", report=report, namespace="bench"
            )
            timings.append(time.monotonic() - started)
            if report.reclaimed + report.waited != expired:
                raise SystemExit(
                    f"swept {report.reclaimed} + {report.waited} waited, expected {expired}"
                )
        return timings
    finally:
        engine.dispose()
        services.drop_database(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 100_000])
    parser.add_argument("--expired", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--started", type=float, default=1.0, help="share of the expired steps started (0..1)"
    )
    args = parser.parse_args()
    print(
        f"sweep benchmark on {os.cpu_count()} cores; {args.expired} expired steps, "
        f"{args.started:.0%} of them started, batches of 500, {args.repeat} runs each"
    )
    for rows in args.rows:
        timings = measure(rows, args.expired, args.repeat, args.started)
        print(
            f"  {rows:>9,} steps: median {statistics.median(timings) * 1000:7.1f} ms "
            f"(min {min(timings) * 1000:.1f}, max {max(timings) * 1000:.1f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
