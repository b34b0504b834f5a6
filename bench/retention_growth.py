"""The retention of what grows, at scale: old dead letters and an expired subscriber's updates.

    python bench/retention_growth.py [--dead-letters 5233] [--updates 200000]

In a scratch database on the server of SASFLOW_DATABASE_URL (default: the local PostgreSQL)
and a scratch namespace on SASFLOW_BROKER_URL: publishes `--dead-letters` dead letters
dead-lettered 20 days ago into `<ns>.dead` (the size of the overload that left 5,233 there)
and times the supervisor's passes that remove them (14-day retention, 1,000 per pass, each
pass one audit record); then fans `--updates` updates out to a subscriber away for 8 days,
expires it, and times the pass that deletes them (5,000 per transaction) while a writer fans
one event out every 10 ms to another subscriber, reporting how long those fan-outs took.
Everything is dropped at the end. See docs/performance.md for the results.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pika
from sqlalchemy import Engine, update

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import scratch
from bench.report import machine_line, say
from sasflow.ops import stream as ops
from sasflow.ops.retention import GrowthRetention
from sasflow.store.db import transaction
from sasflow.store.operator.audit import database_now
from sasflow.store.outbox import stream
from sasflow.store.schema import alerts, subscribers
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import (
    DEAD_AT_HEADER,
    REASON_HEADER,
    SOURCE_HEADER,
    Names,
    declare_common,
)
from tests import services

DAY = 86400.0


def _supervisor(engine: Engine, names: Names, growth: GrowthRetention) -> Supervisor:
    return Supervisor(
        engine,
        names,
        transport=RabbitMQTransport(services.broker_url(), process_name="bench-supervisor"),
        options=SupervisorOptions(growth=growth, prune_interval=0),
    )


def dead_letters(engine: Engine, names: Names, count: int) -> None:
    setup = RabbitMQTransport(services.broker_url(), process_name="bench-setup")
    setup.connect()
    declare_common(setup, names)
    setup.close()
    at = (datetime.now(UTC) - timedelta(days=20)).isoformat()
    body = json.dumps({"workflow": "orders", "key": "k", "input": {"note": "x" * 200}}).encode()
    connection = pika.BlockingConnection(pika.URLParameters(services.broker_url()))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        headers = {DEAD_AT_HEADER: at, SOURCE_HEADER: names.submit, REASON_HEADER: "bench"}
        for i in range(count):
            properties = pika.BasicProperties(
                delivery_mode=2, correlation_id=str(i), headers=headers
            )
            channel.basic_publish(names.dead_letter_exchange, names.submit, body, properties)
    finally:
        connection.close()
    role = _supervisor(engine, names, GrowthRetention(dead_letters_keep_s=14 * DAY))
    passes, removed, seconds = 0, 0, []
    try:
        while True:
            started = time.perf_counter()
            report = role.sweep_once()
            seconds.append(time.perf_counter() - started)
            if report is None:
                raise SystemExit("another supervisor holds the lease of the scratch database")
            if not report.dead_letters_expired:
                break
            passes += 1
            removed += report.dead_letters_expired
    finally:
        role.lease.release(engine)
        role.close()
    say(
        f"dead letters: {removed} of {count} removed in {passes} pass(es), "
        f"{sum(seconds[:-1]):.2f} s in all, {max(seconds[:-1]):.3f} s for the longest pass; "
        f"the pass that found none: {seconds[-1] * 1000:.0f} ms"
    )


def expired_subscriber(engine: Engine, names: Names, count: int) -> None:
    with transaction(engine) as conn:
        gone, _ = ops.subscribe(
            conn,
            name="gone",
            subscriber_id=None,
            where=ops.StreamFilter(),
            owner="bench",
            namespace=names.namespace,
        )
    started = time.perf_counter()
    for first in range(0, count, 10_000):
        feed = [
            stream.FeedEvent(i, "orders", None, {"run": i})
            for i in range(first, min(count, first + 10_000))
        ]
        with transaction(engine) as conn:
            stream.fan_out(conn, feed, namespace=names.namespace)
    say(f"fan-out of {count} updates to the subscriber: {time.perf_counter() - started:.1f} s")
    with transaction(engine) as conn:
        ops.subscribe(
            conn,
            name="here",
            subscriber_id=None,
            where=ops.StreamFilter(),
            owner="bench",
            namespace=names.namespace,
        )
        away = database_now(conn) - timedelta(days=8)
        conn.execute(update(subscribers).where(subscribers.c.id == gone.id).values(seen_at=away))
    growth = GrowthRetention(subscriber_alert_s=DAY, subscriber_expire_s=7 * DAY)
    role = _supervisor(engine, names, growth)
    waits: list[float] = []
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            with transaction(engine) as conn:
                feed = [stream.FeedEvent(0, "orders", None, {"run": 0})]
                stream.fan_out(conn, feed, namespace=names.namespace)
            waits.append(time.perf_counter() - began)
            time.sleep(0.01)

    try:
        role.sweep_once()  # the alert
        with transaction(engine) as conn:
            conn.execute(update(alerts).values(created_at=database_now(conn) - timedelta(days=7)))
        thread = threading.Thread(target=writer)
        thread.start()
        deleted, passes, started = 0, 0, time.perf_counter()
        try:
            while True:
                report = role.sweep_once()
                if report is None:
                    raise SystemExit("another supervisor holds the lease")
                if not report.updates_deleted:
                    break
                passes += 1
                deleted += report.updates_deleted
        finally:
            stop.set()
            thread.join()
    finally:
        role.lease.release(engine)
        role.close()
    waits.sort()
    say(
        f"expired subscriber: {deleted} updates deleted in {passes} pass(es), "
        f"{time.perf_counter() - started:.2f} s; a concurrent fan-out every 10 ms: "
        f"{len(waits)} of them, median {waits[len(waits) // 2] * 1000:.1f} ms, "
        f"longest {waits[-1] * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dead-letters", type=int, default=5233)
    parser.add_argument("--updates", type=int, default=200_000)
    args = parser.parse_args()
    say(machine_line())
    with scratch("growth", []) as (_, engine, names):
        dead_letters(engine, names, args.dead_letters)
        expired_subscriber(engine, names, args.updates)


if __name__ == "__main__":
    main()
