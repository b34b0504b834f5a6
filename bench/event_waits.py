"""What open event waits and unmatched events cost: the claim, the event duty's pass (match,
timeouts, expiry) and storing one event, with many waits open and many events unmatched.

    python bench/event_waits.py [--waits 20000] [--events 20000] [--calls 50]

In a scratch database on the server of SASFLOW_DATABASE_URL (default: the local PostgreSQL):
loads `--waits` running runs, each with one open wait for `payment_confirmed` (correlation
`w-<n>`, timing out in a day), and `--events` unmatched events of the same name whose
correlations match no wait (`e-<n>`), then ANALYZE. Times, with nothing to match or time out:
the claim (batch 100), the duty's `match`, `time_out` and `expire`; then storing one event that
completes an open wait at once, and one that matches nothing. Prints milliseconds per call
(median of `--calls`). Everything is dropped at the end.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import scratch
from bench.report import machine_line, say
from sasflow import Registry, Step, Workflow
from sasflow.agents import Agent
from sasflow.store.db import transaction
from sasflow.store.inbound import ingest, match
from sasflow.store.runs.claim import claim_steps

LOAD = """
INSERT INTO runs (workflow, version, business_key, input, state)
SELECT 'order', 1, 'w-' || g, jsonb_build_object('order_id', 'w-' || g), 'running'
FROM generate_series(1, :waits) g;
INSERT INTO steps (run_id, name, kind, agent, action, depends_on, state, idempotency_key,
                   input, correlation, not_before, timeout_s, max_failures, backoff_initial_s,
                   backoff_multiplier, backoff_max_s, give_up_s)
SELECT id, 'paid', 'forward', 'sasflow.event', 'payment_confirmed', '[]'::jsonb, 'pending',
       md5(id::text), '{"on_timeout": "fail"}'::jsonb, input->>'order_id',
       now() + interval '1 day', 30, 3, 1, 2, 300, 86400
FROM runs;
INSERT INTO inbound_events (name, event_id, correlation, payload, source, expires_at)
SELECT 'payment_confirmed', 'evt-' || g, 'e-' || g, '{}'::jsonb, 'api', now() + interval '7 days'
FROM generate_series(1, :events) g;
ANALYZE runs; ANALYZE steps; ANALYZE inbound_events
"""


def _median_ms(engine: Engine, calls: int, call: Callable[[Connection], object]) -> float:
    times = []
    for _ in range(calls):
        with transaction(engine) as conn:
            start = time.perf_counter()
            call(conn)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waits", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    agent = Agent("work")

    @agent.handler("do")
    def do(_: object) -> None:
        return None

    order = Workflow(
        "order",
        [
            Step("a", "work", "do"),
            Step.wait_for("paid", event="payment_confirmed", match="input.order_id", timeout=60),
        ],
    )
    registry = Registry([order], [agent])
    say(machine_line())
    with scratch("event_waits", ["work"]) as (_, engine, _names):
        start = time.perf_counter()
        with engine.begin() as conn:
            for statement in LOAD.split(";"):
                conn.execute(text(statement), {"waits": args.waits, "events": args.events})
        say(
            f"loaded {args.waits:,} open waits and {args.events:,} unmatched events in "
            f"{time.perf_counter() - start:.1f} s"
        )
        duty: dict[str, Any] = {"batch": 200, "namespace": "bench", "actor": "bench"}
        waits = itertools.count(1)
        strays = itertools.count(1)

        def send(correlation: str, event_id: str) -> Callable[[Connection], object]:
            event = ingest.InboundEvent("payment_confirmed", correlation, event_id, {"ok": 1})
            return lambda conn: ingest.store_event(
                conn, event, source="api", namespace="bench", actor="bench", registry=registry
            )

        def matching(conn: Connection) -> object:
            n = next(waits)
            return send(f"w-{n}", f"hit-{n}")(conn)

        def stray(conn: Connection) -> object:
            n = next(strays)
            return send(f"none-{n}", f"miss-{n}")(conn)

        figures = {
            "claim (batch 100)": lambda c: claim_steps(c, locked_by="bench", batch=100),
            "duty: match, nothing to match": lambda c: match.match(c, registry, **duty),
            "duty: time_out, none due": lambda c: match.time_out(c, registry, **duty),
            "duty: expire, none expired": lambda c: match.expire(c, batch=200),
            "store an event completing its wait": matching,
            "store an event matching nothing": stray,
        }
        for label, call in figures.items():
            say(f"{label + ':':40} {_median_ms(engine, args.calls, call):8.3f} ms")


if __name__ == "__main__":
    main()
