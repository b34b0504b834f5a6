"""What every workload of the suite shares: sizes, scratch services, processes, clocks, /proc."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, Engine, text

from sasflow.messages import Submission
from sasflow.store import migrate
from sasflow.store.db import make_engine
from sasflow.transport.base import Outgoing, Transport
from sasflow.transport.topology import Names
from tests import services
from tests.acceptance.processes import Processes


@dataclass
class Sizes:
    repeat: int
    w0_seconds: float
    w1_runs: int
    w2_runs: int
    w3_seconds: float
    w3_rate: float
    sweep_rows: list[int]
    drain_timeout: float
    clients: int = 4
    """Application client processes of the concurrent forms (W1c, W2c)."""
    ratelimit_backlog: int = 10_000
    ratelimit_seconds: float = 30.0
    flow_limits: str = "none"
    """Flow limits defined for W1/W2 (`--flow-limits`): none, `other` (a rate limit on an
    agent the workload does not use) or `generous` (rate and concurrency limits on its agent
    that never hold a step back): the cost of the budgeted claim (docs/flow-control.md)."""

    @staticmethod
    def of(quick: bool) -> Sizes:
        if quick:
            return Sizes(1, 1.5, 1_000, 300, 5, 20, [100_000], 180, 4, 2_000, 10.0)
        return Sizes(3, 4.0, 10_000, 2_000, 20, 20, [1_000_000, 100_000], 900)


@contextlib.contextmanager
def scratch(
    prefix: str, agents: list[str], *, pool_size: int | None = None
) -> Iterator[tuple[str, Engine, Names]]:
    """A migrated scratch database and a namespace, both dropped on exit whatever happens;
    `pool_size`: the engine's pool (default: make_engine's)."""
    database = services.unique(f"sasflow_bench_{prefix}")
    names = Names(services.unique(f"sfbench{prefix}"))
    services.create_database(database)
    url = services.database_url(database)
    engine = make_engine(url) if pool_size is None else make_engine(url, pool_size=pool_size)
    try:
        migrate.upgrade(engine)
        yield url, engine, names
    finally:
        engine.dispose()
        services.drop_database(database)
        services.delete_namespace(names.namespace, names.all_queues(agents))


@contextlib.contextmanager
def processes(url: str, names: Names, app: str) -> Iterator[Processes]:
    with tempfile.TemporaryDirectory(prefix="sasflow-bench-") as logs:
        procs = Processes(Path(logs), database_url=url, namespace=names.namespace, app=app)
        try:
            yield procs
        finally:
            procs.stop_all()


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def database_clock(engine: Engine) -> float:
    """The database's clock now (epoch seconds): every drain is timed on it."""
    with engine.connect() as conn:
        return float(
            conn.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one()
        )


def autovacuum(engine: Engine) -> bool:
    with engine.connect() as conn:
        return str(conn.execute(text("SHOW autovacuum")).scalar()) == "on"


def analyze(conn: Connection) -> float:
    """ANALYZE every table of the public schema (sasflow's) on `conn`; seconds it took.

    Run after the bench loads tables on a server whose autovacuum is off: a production server's
    autovacuum would have analyzed them, and fresh tables without statistics get plans no
    production server runs. Inside a transaction it also counts the rows that transaction
    inserted (PostgreSQL samples its own uncommitted rows), so the statistics commit with them.
    """
    started = time.perf_counter()
    tables = conn.execute(
        text("SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'")
    ).scalars()
    conn.execute(text(f"ANALYZE {', '.join(tables)}"))
    return time.perf_counter() - started


PUBLISH_BATCH = 500
"""Submissions per confirmed publish batch of `publish_submissions`."""


def publish_submissions(
    transport: Transport, names: Names, *, workflow: str, runs: int, prefix: str
) -> None:
    """Publish `runs` submissions of `workflow` (keys `<prefix><i>`) to `<ns>.submit`, confirmed
    in batches; raises if the broker refused one."""
    for first in range(0, runs, PUBLISH_BATCH):
        batch = [
            Outgoing(
                "",
                names.submit,
                Submission(workflow=workflow, input={"i": i}, key=f"{prefix}{i}").encode(),
            )
            for i in range(first, min(runs, first + PUBLISH_BATCH))
        ]
        errors = [e for e in transport.publish_many(batch) if e is not None]
        if errors:
            raise RuntimeError(f"publish failed: {errors[0]}")


def recorded(engine: Engine, prefix: str) -> int:
    """Runs recorded whose key starts with `prefix`."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM runs WHERE business_key LIKE :p"), {"p": f"{prefix}%"}
            ).scalar_one()
        )


def finished_steps(key_prefix: str) -> str:
    """SQL that gives each run whose key starts with `key_prefix` (loaded by a bench as
    finished one-step runs of `one`) its processed step, as the engine would have left it."""
    return f"""
INSERT INTO steps (run_id, name, kind, agent, action, depends_on, state, idempotency_key,
                   timeout_s, max_failures, backoff_initial_s, backoff_multiplier,
                   backoff_max_s, give_up_s, attempt, failure_count, input, output)
SELECT id, 'only', 'forward', 'noop', 'nothing', '[]'::jsonb, 'processed', md5(id::text),
       30, 3, 1, 2, 300, 86400, 1, 0, '{{}}'::jsonb, '{{}}'::jsonb
FROM runs WHERE business_key LIKE '{key_prefix}%';
"""
