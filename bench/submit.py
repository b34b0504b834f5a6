"""The submission path alone: `submit_run` in the application's transaction, and `<ns>.submit`
through one `sasflow submitter` process.

    python bench/submit.py [--runs 2000] [--workflow one]

On a scratch database and namespace (real PostgreSQL and RabbitMQ), no scheduler running:
- statements per `submit_run` (SQLAlchemy `before_cursor_execute` events inside the caller's
  transaction; BEGIN is sent with the first, COMMIT is one more round trip);
- `submit_run` calls per second, one run per transaction, from 1 thread and from 4 threads,
  this process's CPU time per call and the median time of one transaction (pool checkout
  and pre-ping to COMMIT);
- `--runs` submissions published to `<ns>.submit` beforehand (confirmed), then drained by one
  submitter process: runs per second from its start of consuming to the last run recorded,
  and the submitter's CPU time per submission (/proc/PID/stat).
Prints each figure and the ratio AMQP / `submit_run` (1 thread). A/B: run it with the base's
interpreter (`BASE/.venv/bin/python bench/submit.py` from this checkout, BASE the base's
checkout) and this checkout's, alternated.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Engine, event, text

import sasflow
from bench import apps
from bench.common import publish_submissions, recorded, scratch
from sasflow import submit_run
from sasflow.transport.topology import Names, declare_common
from tests import harness
from tests.acceptance.processes import Processes


def analyze(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("ANALYZE runs; ANALYZE steps; ANALYZE events"))


def statements_per_submit(engine: Engine, workflow: str, ns: str) -> float:
    count = 0

    def counted(*_args: Any) -> None:
        nonlocal count
        count += 1

    with engine.begin() as conn:  # warm: first use of the connection and caches
        submit_run(conn, apps.registry, workflow, {"i": -1}, key="rt-warm", namespace=ns)
    event.listen(engine, "before_cursor_execute", counted)
    try:
        for i in range(20):
            with engine.begin() as conn:
                submit_run(conn, apps.registry, workflow, {"i": i}, key=f"rt{i}", namespace=ns)
    finally:
        event.remove(engine, "before_cursor_execute", counted)
    return count / 20


def submit_rate(
    engine: Engine, workflow: str, ns: str, runs: int, threads: int
) -> tuple[float, float, float]:
    """submit_run calls/s (one run per transaction), CPU ms per call of this process, and the
    median time of one transaction (checkout to commit) in ms."""
    per_thread = runs // threads
    prefix = f"py{threads}-"
    times: list[float] = []

    def client(n: int) -> None:
        for i in range(per_thread):
            began = time.perf_counter()
            with engine.begin() as conn:
                submit_run(
                    conn, apps.registry, workflow, {"i": i}, key=f"{prefix}{n}-{i}", namespace=ns
                )
            times.append(time.perf_counter() - began)

    workers = [threading.Thread(target=client, args=(n,)) for n in range(threads)]
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)
    done = per_thread * threads
    return done / elapsed, used / done * 1000, statistics.median(times) * 1000


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def amqp_rate(
    url: str, engine: Engine, names: Names, workflow: str, runs: int
) -> tuple[float, float]:
    """Runs/s drained by one submitter from a queue holding `runs` submissions, and its CPU ms
    per submission."""
    transport = harness.transport("bench-publisher")
    transport.connect()
    try:
        declare_common(transport, names)
        publish_submissions(transport, names, workflow=workflow, runs=runs, prefix="amqp")
    finally:
        transport.close()
    with tempfile.TemporaryDirectory(prefix="sasflow-bench-submit-") as logs:
        procs = Processes(Path(logs), database_url=url, namespace=names.namespace, app="bench.apps")
        try:
            process = procs.start("submitter", "submitter")
            deadline = time.monotonic() + 60
            while recorded(engine, "amqp") == 0:  # the clock starts with the first commit
                if time.monotonic() > deadline:
                    raise RuntimeError("the submitter recorded nothing")
                time.sleep(0.005)
            started = time.perf_counter()
            first_cpu = cpu_seconds(process.pid)
            start_count = recorded(engine, "amqp")
            while (count := recorded(engine, "amqp")) < runs:
                if time.monotonic() > deadline + 120:
                    raise RuntimeError("the submitter did not record every run")
                time.sleep(0.01)
            elapsed = time.perf_counter() - started
            used = cpu_seconds(process.pid) - first_cpu
            return (count - start_count) / elapsed, used / (count - start_count) * 1000
        finally:
            procs.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workflow", default="one")
    args = parser.parse_args()
    print(f"sasflow from {Path(sasflow.__file__).parent}; load {os.getloadavg()[0]:.1f}")
    with scratch("submit", ["noop"], pool_size=5) as (url, engine, names):
        ns = names.namespace
        rt = statements_per_submit(engine, args.workflow, ns)
        one, cpu_one, p50_one = submit_rate(engine, args.workflow, ns, args.runs, 1)
        four, cpu_four, p50_four = submit_rate(engine, args.workflow, ns, args.runs, 4)
        analyze(engine)
        amqp, cpu_amqp = amqp_rate(url, engine, names, args.workflow, args.runs)
    print(f"statements per submit_run: {rt:.1f} (+ COMMIT)")
    print(
        f"submit_run, 1 thread:  {one:.0f} runs/s, {cpu_one:.2f} ms CPU/run (client), "
        f"transaction p50 {p50_one:.2f} ms"
    )
    print(
        f"submit_run, 4 threads: {four:.0f} runs/s, {cpu_four:.2f} ms CPU/run (client), "
        f"transaction p50 {p50_four:.2f} ms"
    )
    print(f"<ns>.submit drained:   {amqp:.0f} runs/s, {cpu_amqp:.2f} ms submitter CPU/run")
    print(f"ratio AMQP / submit_run 1 thread: {amqp / one:.2f}; / 4 threads: {amqp / four:.2f}")


if __name__ == "__main__":
    main()
