"""What sleeping timer steps cost the schedulers: the claim and the timer duty's reads with many
timers asleep, against as many agent steps backing off (which stay in the claim's index).

    python bench/timers.py [--sleeping 200000] [--calls 200]

In a scratch database on the server of SASFLOW_DATABASE_URL (default: the local PostgreSQL):
loads `--sleeping` running runs, each with one timer step due in a day (generate_series, then
ANALYZE), and times one scheduler pass's statements with nothing due: the claim
(`claim_steps`, batch 100), the timer duty's `fire_due` and `seconds_until_next`. Then the same
steps turned into agent steps backing off a day, to show what the claim would pay for them in
its index. Prints milliseconds per call (median of `--calls`). Everything is dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import scratch
from bench.report import machine_line, say
from sasflow import Registry, Step, Workflow
from sasflow.agents import Agent
from sasflow.store.db import transaction
from sasflow.store.runs import timers
from sasflow.store.runs.claim import claim_steps

LOAD = """
INSERT INTO runs (workflow, version, business_key, input, state)
SELECT 'nap', 1, 'nap-' || g, '{}'::jsonb, 'running' FROM generate_series(1, :n) g;
INSERT INTO steps (run_id, name, kind, agent, action, depends_on, state, idempotency_key,
                   not_before, timeout_s, max_failures, backoff_initial_s, backoff_multiplier,
                   backoff_max_s, give_up_s)
SELECT id, 'wait', 'forward', 'sasflow.timer', 'sleep', '[]'::jsonb, 'pending', md5(id::text),
       now() + interval '1 day', 30, 3, 1, 2, 300, 86400
FROM runs;
ANALYZE runs; ANALYZE steps
"""


def _median_ms(engine: Engine, calls: int, call: Callable[..., object]) -> float:
    times = []
    for _ in range(calls):
        with transaction(engine) as conn:
            start = time.perf_counter()
            call(conn)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleeping", type=int, default=200_000)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    agent = Agent("work")

    @agent.handler("do")
    def do(_: object) -> None:
        return None

    registry = Registry(
        [Workflow("nap", [Step("a", "work", "do"), Step.sleep("wait", seconds=1)])], [agent]
    )
    say(machine_line())
    with scratch("timers", ["work"]) as (_, engine, _names):
        start = time.perf_counter()
        with engine.begin() as conn:
            for statement in LOAD.split(";"):
                conn.execute(text(statement), {"n": args.sleeping})
        say(f"loaded {args.sleeping:,} sleeping timers in {time.perf_counter() - start:.1f} s")

        def claim(conn: object) -> object:
            return claim_steps(conn, locked_by="bench", batch=100)  # type: ignore[arg-type]

        def fire(conn: object) -> object:
            return timers.fire_due(
                conn,  # type: ignore[arg-type]
                registry,
                batch=200,
                namespace="bench",
                actor="bench",
            )

        def following(conn: object) -> object:
            return timers.seconds_until_next(conn)  # type: ignore[arg-type]

        asleep = _median_ms(engine, args.calls, claim)
        say(f"claim, {args.sleeping:,} timers asleep:   {asleep:.3f} ms")
        say(f"fire_due, none due:            {_median_ms(engine, args.calls, fire):.3f} ms")
        say(f"seconds_until_next:            {_median_ms(engine, args.calls, following):.3f} ms")
        with engine.begin() as conn:
            conn.execute(text("UPDATE steps SET agent = 'work', action = 'do'"))
            conn.execute(text("ANALYZE steps"))
        say(
            f"claim, as many agent steps backing off: "
            f"{_median_ms(engine, args.calls, claim):.3f} ms"
        )


if __name__ == "__main__":
    main()
