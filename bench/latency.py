"""Submit-to-completion latency of one-step runs, one at a time (a first cut of issue 5's W3).

    python bench/latency.py [--runs 200] [--rate 20]

Starts a scheduler and an agent (threads of this process, real PostgreSQL and RabbitMQ, a
scratch database and namespace), submits one run at a time in its own transaction at `--rate`
runs/s, and times each from just before the submitting commit to the arrival of its
`run.completed` status notification on a queue bound to the status exchange. Prints p50, p95
and p99 in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sasflow import Registry, Step, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.store import migrate
from sasflow.store.db import make_engine
from sasflow.transport.topology import Names
from tests import services
from tests.integration import harness


def build_registry() -> tuple[Registry, Agent]:
    noop = Agent("noop")

    @noop.handler("nothing")
    def nothing(_call: Call) -> None:
        return None

    return Registry([Workflow("one", [Step("only", "noop", "nothing")])], [noop]), noop


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    database = services.unique("sasflow_bench_latency")
    services.create_database(database)
    url = services.database_url(database)
    engine = make_engine(url)
    names = Names(services.unique("sfbench"))
    registry, agent = build_registry()
    try:
        migrate.upgrade(engine)
        queue = harness.bind_status_queue(names, "one.run.completed")
        completed: dict[int, float] = {}
        submitted: dict[int, float] = {}
        done = threading.Event()

        def listen() -> None:
            connection = pika.BlockingConnection(pika.URLParameters(services.broker_url()))
            channel = connection.channel()
            for _method, _props, body in channel.consume(queue, auto_ack=True,
                                                          inactivity_timeout=0.05):
                if body is not None:
                    completed[json.loads(body)["run_id"]] = time.perf_counter()
                if done.is_set():
                    break
            connection.close()

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        with harness.running(harness.scheduler(engine, url, registry, names),
                             harness.agent(agent, names)):
            time.sleep(1.0)
            for i in range(args.runs):
                started = time.perf_counter()
                with engine.begin() as conn:
                    run = submit_run(conn, registry, "one", {"i": i}, key=f"r{i}",
                                     namespace=names.namespace)
                submitted[run.run_id] = started
                time.sleep(max(0.0, 1 / args.rate - (time.perf_counter() - started)))
            deadline = time.monotonic() + 30
            while len(completed) < args.runs and time.monotonic() < deadline:
                time.sleep(0.05)
        done.set()
        listener.join(5)
        latencies = [(completed[r] - submitted[r]) * 1000 for r in submitted if r in completed]
        print(f"{len(latencies)}/{args.runs} one-step runs at {args.rate:g}/s: "
              f"p50 {statistics.median(latencies):.1f} ms, p95 {percentile(latencies, .95):.1f} "
              f"ms, p99 {percentile(latencies, .99):.1f} ms (submit commit -> completion "
              "notification)")
    finally:
        engine.dispose()
        services.drop_database(database)
        services.delete_namespace(names.namespace, names.all_queues(["noop"]))


if __name__ == "__main__":
    main()
