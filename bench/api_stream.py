"""Submit-to-UPDATE latency of the subscription stream: from a REST submission to the arrival
of that run's UPDATEs on an SDK subscription.

    python bench/api_stream.py [--runs 200] [--rate 20]

Starts `sasflow api` (a process), a scheduler and an agent (threads of this process), on real
PostgreSQL and RabbitMQ with a scratch database and namespace; subscribes with
`sasflow.client` (acknowledging each update), then POSTs one-step runs to /v1/runs at
`--rate` runs/s. Each run is timed from just before its POST to the arrival on the stream of
its first UPDATE (`pending`, relayed after the scheduler's claim) and of its `completed` one.
Prints p50, p95 and p99 in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.apps import noop, registry
from bench.common import scratch, wait_until
from bench.report import load_line, machine_line, percentile
from sasflow.client import Client, StreamUpdate
from tests import harness, services
from tests.api.server import api_server, make_token


def _line(name: str, values: list[float], runs: int) -> str:
    return (
        f"  {name:<22} {len(values)}/{runs}: p50 {statistics.median(values):.1f} ms, "
        f"p95 {percentile(values, 0.95):.1f} ms, p99 {percentile(values, 0.99):.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    print(machine_line())
    print(load_line())
    first: dict[int, float] = {}
    completed: dict[int, float] = {}
    submitted: dict[int, float] = {}
    posts: list[float] = []

    def on_update(update: StreamUpdate) -> None:
        now = time.perf_counter()
        if update.entity == "run":
            first.setdefault(update.run, now)
            if update.state == "completed":
                completed[update.run] = now

    with (
        tempfile.TemporaryDirectory(prefix="sasflow-bench-") as logs,
        scratch("stream", ["noop"]) as (url, engine, names),
        api_server(
            Path(logs),
            database_url=url,
            broker_url=services.broker_url(),
            namespace=names.namespace,
            app="bench.apps",
        ) as server,
    ):
        base = server.base_url
        secret = make_token(engine, "bench", "submit", "read")
        with (
            harness.running(
                harness.scheduler(engine, url, registry, names), harness.agent(noop, names)
            ),
            Client(base, secret) as client,
        ):
            subscription = client.subscription({"workflows": ["one"]}, on_update, name="bench")
            follower = threading.Thread(target=subscription.run, daemon=True)
            follower.start()
            wait_until(lambda: subscription.connections == 1, 30)
            auth = {"Authorization": f"Bearer {secret}"}
            with httpx.Client(base_url=base, headers=auth) as http:
                for i in range(args.runs):
                    started = time.perf_counter()
                    answer = http.post("/v1/runs", json={"workflow": "one", "input": {"i": i}})
                    answer.raise_for_status()
                    submitted[int(answer.json()["id"])] = started
                    posts.append((time.perf_counter() - started) * 1000)
                    time.sleep(max(0.0, 1 / args.rate - (time.perf_counter() - started)))
            wait_until(lambda: len(completed) >= args.runs, 60)
            subscription.stop()
            follower.join(5)
    to_first = [(first[r] - t) * 1000 for r, t in submitted.items() if r in first]
    to_done = [(completed[r] - t) * 1000 for r, t in submitted.items() if r in completed]
    print(f"{args.runs} one-step runs POSTed at {args.rate:g}/s, UPDATEs on one SDK stream:")
    print(_line("POST /v1/runs answered", posts, args.runs))
    print(_line("submit -> first UPDATE", to_first, args.runs))
    print(_line("submit -> completed", to_done, args.runs))


if __name__ == "__main__":
    main()
