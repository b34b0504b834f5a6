"""W0: the raw limits of this machine's PostgreSQL and RabbitMQ, the yardstick of every ratio.

- single-row UPDATE transactions/s with the engine's own connection settings (`make_engine`);
- a `FOR UPDATE SKIP LOCKED` claim loop on a scratch table (claims/s for a number of claimer
  threads and a batch size, one transaction per claim statement);
- RabbitMQ request/reply round trips/s with pika: durable queues, persistent messages, publisher
  confirms on both sides, the server acks a request after its reply is confirmed.

Every loop runs for a fixed time and is also bounded in count.
"""

from __future__ import annotations

import threading
import time

import pika
from pika.adapters.blocking_connection import BlockingChannel
from sqlalchemy import Engine, text

from tests import services

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


def _channel(connection: pika.BlockingConnection) -> BlockingChannel:
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def roundtrip_rate(  # noqa: PLR0915 - one client loop and its echo server read as one
    namespace: str, in_flight: int, seconds: float
) -> float:
    """Request/reply round trips/s with `in_flight` requests outstanding at any time."""
    requests, replies = f"{namespace}.rr.requests", f"{namespace}.rr.replies"
    persistent = pika.BasicProperties(delivery_mode=2, reply_to=replies)
    stop = threading.Event()
    ready = threading.Event()

    def server() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(services.broker_url()))
        try:
            channel = _channel(connection)
            channel.basic_qos(prefetch_count=max(1, in_flight))
            ready.set()
            for method, props, body in channel.consume(requests, inactivity_timeout=0.1):
                if stop.is_set():
                    break
                if method is None or method.delivery_tag is None or props is None:
                    continue
                channel.basic_publish(
                    "",
                    props.reply_to or replies,
                    body or b"",
                    pika.BasicProperties(delivery_mode=2),
                )
                channel.basic_ack(method.delivery_tag)
            channel.cancel()
        finally:
            connection.close()

    connection = pika.BlockingConnection(pika.URLParameters(services.broker_url()))
    worker = threading.Thread(target=server, daemon=True)
    try:
        channel = _channel(connection)
        channel.queue_declare(requests, durable=True)
        channel.queue_declare(replies, durable=True)
        worker.start()
        ready.wait(10)
        done = 0
        started = time.perf_counter()
        end = started + seconds
        for _ in range(in_flight):
            channel.basic_publish("", requests, b"ping", persistent)
        outstanding = in_flight
        for method, _props, _body in channel.consume(replies, inactivity_timeout=5):
            if method is None or method.delivery_tag is None:
                break  # bounded: a lost reply cannot hang the benchmark
            channel.basic_ack(method.delivery_tag)
            outstanding -= 1
            if time.perf_counter() < end and done < MAX_OPS:
                done += 1
                channel.basic_publish("", requests, b"ping", persistent)
                outstanding += 1
            elif outstanding == 0:
                break
        elapsed = time.perf_counter() - started
        channel.cancel()
        return done / min(elapsed, seconds) if done else 0.0
    finally:
        stop.set()
        worker.join(10)
        try:
            cleanup = connection.channel()
            cleanup.queue_delete(requests)
            cleanup.queue_delete(replies)
        finally:
            connection.close()
