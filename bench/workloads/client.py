"""One application client of the concurrent forms (W1c, W2c), as its own process.

    python -m bench.workloads.client WORKFLOW PREFIX FIRST COUNT

Connects to SASFLOW_DATABASE_URL, prints `ready`, waits for a line on stdin, then submits runs
FIRST..FIRST+COUNT-1 of WORKFLOW (bench.apps), each with `sasflow.submit_run` in its own
transaction (keys PREFIX + number), as an application records one order at a time. Prints one
JSON line: wall-clock start and end of the submissions (epoch seconds) and the CPU seconds this
process spent on them.
"""

from __future__ import annotations

import json
import os
import sys
import time

from sqlalchemy import text

from bench import apps
from sasflow import submit_run
from sasflow.store.db import make_engine


def main(workflow: str, prefix: str, first: int, count: int) -> None:
    namespace = os.environ["SASFLOW_NAMESPACE"]
    engine = make_engine(os.environ["SASFLOW_DATABASE_URL"], application_name="sasflow-bench-app")
    try:
        with engine.connect() as conn:  # connected before the clock starts
            conn.execute(text("SELECT 1"))
        print("ready", flush=True)
        if not sys.stdin.readline().strip():
            return  # the bench gave up: nothing to submit
        started, cpu = time.time(), time.process_time()
        for i in range(first, first + count):
            with engine.begin() as conn:
                submit_run(
                    conn, apps.registry, workflow, {"i": i}, key=f"{prefix}{i}", namespace=namespace
                )
        ended = time.time()
        done = {"start": started, "end": ended, "cpu": time.process_time() - cpu}
        print(json.dumps(done), flush=True)
    finally:
        engine.dispose()


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit("usage: python -m bench.workloads.client WORKFLOW PREFIX FIRST COUNT")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
