"""W0: the raw limits of this machine's PostgreSQL (RabbitMQ's: bench/roundtrip.py).

- single-row UPDATE transactions/s with the engine's own connection settings (`make_engine`);
- a `FOR UPDATE SKIP LOCKED` claim loop on a scratch table (claims/s for a number of claimer
  threads and a batch size, one transaction per claim statement).

Every loop runs for a fixed time and is also bounded in count.
"""

from __future__ import annotations

import threading
import time

from sqlalchemy import Engine, text

MAX_OPS = 10_000_000


def update_rate(engine: Engine, seconds: float) -> float:
    """Single-row UPDATE transactions/s, one connection, one commit each."""
    with engine.begin() as conn:
        conn.execute(
            text("CREATE TABLE IF NOT EXISTS bench_counter (id int PRIMARY KEY, n bigint NOT NULL)")
        )
        conn.execute(text("INSERT INTO bench_counter VALUES (1, 0) ON CONFLICT DO NOTHING"))
    done = 0
    started = time.perf_counter()
    end = started + seconds
    while time.perf_counter() < end and done < MAX_OPS:
        with engine.begin() as conn:
            conn.execute(text("UPDATE bench_counter SET n = n + 1 WHERE id = 1"))
        done += 1
    return done / (time.perf_counter() - started)


CLAIM = text("""
WITH c AS (SELECT id FROM bench_jobs WHERE state = 'pending' ORDER BY id
           LIMIT :n FOR UPDATE SKIP LOCKED)
UPDATE bench_jobs j SET state = 'claimed' FROM c WHERE j.id = c.id RETURNING j.id
""")


def claim_rate(
    engine: Engine, claimers: int, batch: int, seconds: float, rows: int = 300_000
) -> float:
    """Rows claimed/s by `claimers` threads, each claiming `batch` rows per transaction."""
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS bench_jobs"))
        conn.execute(
            text(
                "CREATE TABLE bench_jobs (id bigint GENERATED ALWAYS AS IDENTITY "
                "PRIMARY KEY, state text NOT NULL DEFAULT 'pending', payload jsonb)"
            )
        )
        conn.execute(
            text("CREATE INDEX ix_bench_jobs_pending ON bench_jobs (id) WHERE state = 'pending'")
        )
        conn.execute(
            text(
                "INSERT INTO bench_jobs (payload) SELECT jsonb_build_object('i', g) "
                "FROM generate_series(1, :rows) g"
            ),
            {"rows": rows},
        )
        conn.execute(text("ANALYZE bench_jobs"))
    counts = [0] * claimers
    last = [0.0] * claimers  # when each claimer last claimed: the table may run dry early
    start = threading.Barrier(claimers + 1)
    stop = threading.Event()

    def claimer(index: int) -> None:
        start.wait(30)
        while not stop.is_set():
            with engine.begin() as conn:
                got = len(conn.execute(CLAIM, {"n": batch}).fetchall())
            counts[index] += got
            last[index] = time.perf_counter()
            if got == 0:
                return

    threads = [threading.Thread(target=claimer, args=(i,), daemon=True) for i in range(claimers)]
    for thread in threads:
        thread.start()
    start.wait(30)
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(30)
    elapsed = max(last) - started
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE bench_jobs"))
    return sum(counts) / elapsed
