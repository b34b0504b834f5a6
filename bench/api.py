"""REST submissions per second, as a ratio of the AMQP submission rate measured in the same run.

    python bench/api.py [--runs 1000]

On a scratch database and namespace (real PostgreSQL and RabbitMQ):
- AMQP: `--runs` submissions published to `<ns>.submit` (confirmed, in batches of 500) and
  recorded by one `sasflow submitter` process; the rate is runs recorded per second, from the
  first publish to the last run in the database.
- REST: `--runs` POST /v1/runs to one `sasflow api` process (each answered after its commit),
  from one client, then from 8 concurrent clients (threads, keep-alive connections).
- REST batches: `--runs` in POST /v1/runs/batch requests of 100, then of 500 runs, from one
  client (each batch one transaction, answered after its commit).
No scheduler runs: the figures are the submission path alone. Prints each rate and its ratio
to the AMQP rate.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from sqlalchemy import Engine

from bench.common import processes, publish_submissions, recorded, scratch, wait_until
from bench.report import machine_line
from sasflow.transport.topology import Names, declare_common
from tests import harness, services
from tests.api.server import api_server, make_token


def amqp_rate(url: str, engine: Engine, names_ns: str, runs: int) -> float:
    """Runs per second recorded through the AMQP face (publish -> submitter -> database)."""
    names = Names(names_ns)
    transport = harness.transport("bench-publisher")
    transport.connect()
    try:
        declare_common(transport, names)
        with processes(url, names, "bench.apps") as procs:
            procs.start("submitter", "submitter")
            time.sleep(2)  # let it connect and consume before the clock starts
            started = time.perf_counter()
            publish_submissions(transport, names, workflow="one", runs=runs, prefix="amqp")
            if not wait_until(lambda: recorded(engine, "amqp") >= runs, timeout=600, interval=0.02):
                raise RuntimeError("the submitter did not record every run")
            return runs / (time.perf_counter() - started)
    finally:
        transport.close()


def rest_rate(base_url: str, token: str, runs: int, clients: int, prefix: str) -> float:
    """Runs per second submitted with POST /v1/runs from `clients` concurrent clients."""

    per_client = runs // clients
    failures: list[str] = []

    def client(n: int) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base_url, headers=headers, timeout=60) as http:
            for i in range(per_client):
                response = http.post(
                    "/v1/runs",
                    json={"workflow": "one", "input": {"i": i}, "key": f"{prefix}{n}-{i}"},
                )
                if response.status_code != 201:
                    failures.append(response.text)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} submissions failed: {failures[0]}")
    return per_client * clients / elapsed


def batch_rate(base_url: str, token: str, runs: int, size: int, prefix: str) -> float:
    """Runs per second submitted with POST /v1/runs/batch, `size` runs a request, one client."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as http:
        started = time.perf_counter()
        for first in range(0, runs, size):
            batch = [
                {"workflow": "one", "input": {"i": i}, "key": f"{prefix}{i}"}
                for i in range(first, min(first + size, runs))
            ]
            response = http.post("/v1/runs/batch", json={"runs": batch})
            if response.status_code != 200 or response.json()["created"] != len(batch):
                raise RuntimeError(f"batch refused: {response.text[:500]}")
        return runs / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    print(machine_line())
    with scratch("api", ["noop"]) as (url, engine, names):
        amqp = amqp_rate(url, engine, names.namespace, args.runs)
        token = make_token(engine, "bench", "submit")
        with (
            tempfile.TemporaryDirectory(prefix="sasflow-bench-api-") as logs,
            api_server(
                Path(logs),
                database_url=url,
                broker_url=services.broker_url(),
                namespace=names.namespace,
                app="bench.apps",
            ) as api,
        ):
            one = rest_rate(api.base_url, token, args.runs, 1, "rest1-")
            eight = rest_rate(api.base_url, token, args.runs, 8, "rest8-")
            batches = {
                size: batch_rate(api.base_url, token, args.runs, size, f"batch{size}-")
                for size in (100, 500)
            }
    print(f"AMQP submissions: {amqp:.0f} runs/s (1 submitter process)")
    print(f"REST, 1 client:   {one:.0f} runs/s = {one / amqp:.2f} x AMQP")
    print(f"REST, 8 clients:  {eight:.0f} runs/s = {eight / amqp:.2f} x AMQP")
    for size, rate in batches.items():
        print(f"REST batches of {size}: {rate:.0f} runs/s = {rate / amqp:.2f} x AMQP")


if __name__ == "__main__":
    main()
