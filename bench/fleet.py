"""The fleet's costs: recording heartbeats, and how fast a breaker opening reaches the peers.

    python bench/fleet.py [--instances 500] [--peers 4] [--repeat 5]

1. Publishes one heartbeat for each of `--instances` agent instances to `<ns>.fleet` and times
   the scheduler's `FleetRecorder.poll` that takes, acks and records them (one transaction),
   in a scratch database on the server of SASFLOW_DATABASE_URL (default: the local PostgreSQL).
   With the default 5 s interval, N instances send N/5 heartbeats a second.
2. Starts `--peers` agent processes' workers (threads, each its own connection) of one agent,
   trips one instance's breaker and times until every other instance's breaker is open.
Prints the median and the range of `--repeat` measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sasflow.agents import Agent
from sasflow.agents.worker import AgentOptions, AgentWorker
from sasflow.fleet_messages import AgentHeartbeat
from sasflow.policy import BreakerPolicy
from sasflow.scheduler.fleet import FleetRecorder
from sasflow.store import migrate
from sasflow.store.db import make_engine
from sasflow.transport.base import Outgoing
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names, declare_common
from tests import services


def _figures(samples: list[float]) -> str:
    return (
        f"median {statistics.median(samples) * 1000:.1f} ms "
        f"(range {min(samples) * 1000:.1f}-{max(samples) * 1000:.1f})"
    )


def record_heartbeats(instances: int, repeat: int) -> list[float]:
    names = Names(services.unique("sfbench_fleet"))
    database = services.unique("sasflow_bench_fleet")
    services.create_database(database)
    engine = make_engine(services.database_url(database))
    transport = RabbitMQTransport(services.broker_url(), process_name="bench-fleet")
    try:
        migrate.upgrade(engine)
        transport.connect()
        declare_common(transport, names)
        recorder = FleetRecorder(engine, transport, names)
        samples = []
        for _ in range(repeat):
            transport.publish_many(
                [
                    Outgoing(
                        exchange=names.fleet,
                        routing_key="bench",
                        body=AgentHeartbeat(
                            agent="bench",
                            instance_id=f"agent-bench:host:{i}:00000000",
                            hostname="host",
                            pid=i,
                            version="bench",
                            concurrency=8,
                            in_flight=i % 8,
                            breakers={"remote": "closed"},
                            interval_s=5.0,
                        ).encode(),
                    )
                    for i in range(instances)
                ]
            )
            started = time.perf_counter()
            taken = 0
            while taken < instances:
                taken += recorder.poll()
            samples.append(time.perf_counter() - started)
        return samples
    finally:
        transport.close()
        engine.dispose()
        services.drop_database(database)
        services.delete_namespace(names.namespace, names.all_queues([]))


def breaker_propagation(peers: int, repeat: int) -> list[float]:
    names = Names(services.unique("sfbench_breakers"))
    samples = []
    try:
        for _ in range(repeat):
            policy = BreakerPolicy(fail_max=1, reset_timeout=60)
            workers = [
                AgentWorker(
                    Agent("bench", breakers={"remote": policy}),
                    RabbitMQTransport(services.broker_url(), process_name=f"bench-{i}"),
                    names,
                    options=AgentOptions(heartbeat_interval=60),
                )
                for i in range(peers)
            ]
            threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
            for thread in threads:
                thread.start()
            while not all(w.fleet.heartbeats for w in workers):
                time.sleep(0.01)
            started = time.perf_counter()
            with contextlib.suppress(ConnectionError):
                workers[0].breaker("remote").call(_down, lambda _exc: True)
            while not all(w.breaker("remote").state == "open" for w in workers):
                time.sleep(0.001)
            samples.append(time.perf_counter() - started)
            for worker in workers:
                worker.stop_event.set()
            for thread in threads:
                thread.join(10)
        return samples
    finally:
        services.delete_namespace(names.namespace, names.all_queues([]))


def _down() -> None:
    raise ConnectionError("down")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=500)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    recorded = record_heartbeats(args.instances, args.repeat)
    print(
        f"record {args.instances} heartbeats (take, ack, one upsert transaction): "
        f"{_figures(recorded)}"
    )
    spread = breaker_propagation(args.peers, args.repeat)
    print(f"breaker open on 1 instance -> open on all {args.peers}: {_figures(spread)}")


if __name__ == "__main__":
    main()
