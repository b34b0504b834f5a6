"""What a map step costs: creating its items, and draining them with one agent process.

    python bench/maps.py [--items 10000] [--parallelism 50]

In a scratch database and namespace on the local services: one run of `load -> each` where
`each` maps over `steps.load.lines` (`--items` lines). `load` is marked processed by hand, then
the run is advanced in one transaction, which creates the items (timed: the creation). Then a
scheduler and an agent (threads of this process, RabbitMQ, the agent's default concurrency)
drain the items, whose handler returns at once, until the run completes (timed: the drain,
printed as items per second). Every decision of the run reads all its items, so the drain
slows as the map grows (docs/concepts.md, "Map steps", Cost). Everything is dropped at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sqlalchemy import select, update

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import scratch, wait_until
from bench.report import machine_line, say
from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.agents.worker import DEFAULT_CONCURRENCY
from sasflow.store.db import transaction
from sasflow.store.runs.advance import advance_runs
from sasflow.store.schema import runs, steps
from tests import harness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--parallelism", type=int, default=50)
    args = parser.parse_args()
    agent = Agent("mapper")

    @agent.handler("load")
    def load(_call: Call) -> None:  # marked processed by hand: never called
        raise AssertionError("load runs by hand")

    @agent.handler("each")
    def each(call: Call) -> int | None:
        return call.map_index

    policy = StepPolicy(timeout=60)
    workflow = Workflow(
        "mapped",
        [
            Step("load", "mapper", "load", policy=policy),
            Step.map(
                "each",
                agent="mapper",
                action="each",
                items="steps.load.lines",
                max_items=max(args.items, 1),
                parallelism=args.parallelism,
                policy=policy,
            ),
        ],
    )
    registry = Registry([workflow], [agent])
    say(machine_line())
    with scratch("maps", ["mapper"]) as (url, engine, names):
        with engine.begin() as conn:
            run_id = submit_run(
                conn, registry, "mapped", {}, key="m", namespace=names.namespace
            ).run_id
            conn.execute(
                update(steps)
                .where(steps.c.run_id == run_id, steps.c.name == "load")
                .values(state="processed", output={"lines": list(range(args.items))})
            )
        start = time.perf_counter()
        with transaction(engine) as conn:
            advance_runs(conn, registry, [run_id], actor="bench")
        created = time.perf_counter() - start
        start = time.perf_counter()

        def completed() -> bool:
            with engine.connect() as conn:
                state = conn.execute(select(runs.c.state).where(runs.c.id == run_id)).scalar()
            return state == "completed"

        with harness.running(
            harness.scheduler(engine, url, registry, names),
            harness.agent(agent, names, concurrency=DEFAULT_CONCURRENCY),
        ):
            if not wait_until(completed, 3600, interval=0.1):
                raise SystemExit("the map did not complete within an hour")
            drained = time.perf_counter() - start
    say(
        f"map of {args.items} items, parallelism {args.parallelism}: created in "
        f"{created * 1000:.0f} ms; drained in {drained:.1f} s "
        f"({args.items / drained:.0f} items/s, one agent process)"
    )


if __name__ == "__main__":
    main()
