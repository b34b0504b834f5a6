"""Recurring schedules over a scheduler cluster: 1,000 schedules every second, 3 schedulers.

    python bench/schedules.py [--schedules 1000] [--schedulers 3] [--duration 20]
                              [--lease-ttl 3] [--assignment acquire|scope|both]

In a scratch database and namespace on SASFLOW_DATABASE_URL / SASFLOW_BROKER_URL (default: the
local services), starts `--schedulers` `sasflow scheduler` processes, adds the schedules (every
second, workflow bench.apps `tick`) and prints:

- ticks fired per second over `--duration` seconds, and ticks fired more than 1 s late
  (database clock: fired_at - tick time);
- X per scheduler as acquired, then (acquire) after a drain/undrain rebalance (each scheduler
  above K/S is drained and undrained as soon as it holds K/S or fewer), and max/min (target
  <= 1.5); with `scope` the plan is balanced by construction: X as planned, no rebalance;
- the time from `kill -9` of the most loaded scheduler to every schedule it held being
  acquired elsewhere, and to each having fired elsewhere (target <= lease TTL + 1 s).

`--assignment both` runs the whole bench once per strategy (each in its own scratch database)
and then prints the figures side by side. Everything is dropped at the end. See
docs/cluster.md for the results.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import apps
from bench.common import processes, scratch, wait_until
from bench.report import load_line, machine_line, say, verdict
from sasflow.ops import registrations as scheduler_ops
from sasflow.ops import schedules as schedule_ops
from sasflow.schedules.definition import Schedule
from sasflow.store.db import transaction
from sasflow.transport.topology import Names
from tests.acceptance.processes import Processes

HELD = """
SELECT s.name, count(c.id) FROM schedulers s LEFT JOIN schedules c ON c.owner = s.id
WHERE s.lease_expires_at > now() GROUP BY s.name ORDER BY s.name
"""
WINDOW = """
SELECT count(*), count(*) FILTER (WHERE fired_at - tick_at > interval '1 second')
FROM schedule_ticks WHERE tick_at >= :start AND tick_at < :end
"""
NOT_TAKEN = """
SELECT count(*) FROM schedules c WHERE c.id = ANY(:ids) AND NOT EXISTS
(SELECT 1 FROM schedulers s WHERE s.id = c.owner AND s.lease_expires_at > now()
 AND s.name <> :victim)
"""
FIRED_ELSEWHERE = """
SELECT count(DISTINCT schedule_id) FROM schedule_ticks
WHERE schedule_id = ANY(:ids) AND fired_by <> :victim AND fired_at >= :since
"""


def held(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {name: int(count) for name, count in conn.execute(text(HELD))}


def unowned(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM schedules c WHERE c.owner IS NULL OR NOT EXISTS "
                    "(SELECT 1 FROM schedulers s WHERE s.id = c.owner "
                    "AND s.lease_expires_at > now())"
                )
            ).scalar_one()
        )


def add_schedules(engine: Engine, count: int, names: Names) -> None:
    with transaction(engine) as conn:
        for number in range(count):
            schedule_ops.add(
                conn,
                Schedule(f"b{number:05d}", "tick", every=1, catch_up="latest"),
                apps.registry,
                actor="bench",
                reason=None,
                namespace=names.namespace,
            )


def rebalance(engine: Engine, names: Names, target: int, *, rounds: int = 6) -> int:
    """Drain the scheduler holding the most until it holds `target` or fewer, let the others
    take what it released, undrain it; again while one holds more than `target` (what it
    releases goes to whichever acquires). Returns the rounds taken."""
    for done in range(rounds):
        counts = held(engine)
        name = max(counts, key=lambda n: counts[n])
        if counts[name] <= target:
            return done
        with transaction(engine) as conn:
            scheduler_ops.drain(
                conn, name, actor="bench", reason="rebalance", namespace=names.namespace
            )
        wait_until(_at_most(engine, name, target), timeout=30, interval=0.002)
        with transaction(engine) as conn:
            scheduler_ops.undrain(
                conn, name, actor="bench", reason="rebalance", namespace=names.namespace
            )
        wait_until(lambda: unowned(engine) == 0, timeout=30)
    return rounds


def as_planned(engine: Engine) -> bool:
    """The scope plan is ready and each scheduler holds its range's size."""
    with transaction(engine) as conn:
        plan = scheduler_ops.plan_view(conn)
    planned = {r["name"]: r["size"] for r in plan["ranges"]}
    return plan["state"] == "ready" and {n: c for n, c in held(engine).items() if c} == {
        n: c for n, c in planned.items() if c
    }


def db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        value: datetime = conn.execute(text("SELECT now()")).scalar_one()
    return value


def _at_most(engine: Engine, name: str, target: int) -> Callable[[], bool]:
    return lambda: held(engine).get(name, 0) <= target


def measure(args: argparse.Namespace, assignment: str) -> dict[str, str]:
    """One run of the bench with `assignment`; its figures, as printed."""
    figures: dict[str, str] = {}
    with (
        scratch("sched", ["noop"]) as (url, engine, names),
        processes(url, names, "bench.apps") as procs,
    ):
        members = [f"sched{i}" for i in range(1, args.schedulers + 1)]
        for number, name in enumerate(members, start=1):
            procs.start(
                name,
                "scheduler",
                "--name",
                name,
                "--address",
                f"127.0.0.{number}",
                "--lease-ttl",
                str(args.lease_ttl),
                "--assignment",
                assignment,
            )
        if not wait_until(lambda: len(held(engine)) == len(members), timeout=60):
            raise SystemExit(f"schedulers did not register: {held(engine)}")
        add_schedules(engine, args.schedules, names)
        if not wait_until(lambda: unowned(engine) == 0, timeout=60):
            raise SystemExit(f"{unowned(engine)} schedules never acquired")
        if assignment == "scope" and not wait_until(lambda: as_planned(engine), timeout=60):
            raise SystemExit(f"the plan was never followed: {held(engine)}")
        say(
            f"{args.schedules} schedules every second over {len(members)} schedulers "
            f"(lease TTL {args.lease_ttl:g}s, assignment {assignment})"
        )
        figures["held as acquired"] = "/".join(str(n) for n in held(engine).values())
        say(f"  held as acquired: {held(engine)}")

        time.sleep(2)  # past the first ticks of each holder
        start = db_now(engine)
        time.sleep(args.duration)
        end = db_now(engine)
        time.sleep(2)  # let the last ticks of the window fire, however late
        with engine.connect() as conn:
            fired, late = conn.execute(text(WINDOW), {"start": start, "end": end}).one()
        seconds = (end - start).total_seconds()
        figures["ticks/s"] = f"{fired / seconds:,.0f}"
        figures["late by > 1 s"] = f"{late} of {fired}"
        say(
            f"  ticks fired: {fired / seconds:,.0f}/s over {seconds:.0f}s "
            f"(expected {args.schedules}/s); late by more than 1 s: {late} of {fired}"
        )

        started = time.monotonic()
        rounds = 0
        if assignment == "acquire":  # scope's plan is balanced by construction
            target = -(-args.schedules // len(members))
            rounds = rebalance(engine, names, target + max(1, target // 10))
        counts = {name: held(engine).get(name, 0) for name in members}  # a dead one holds 0
        ratio = max(counts.values()) / max(1, min(counts.values()))
        figures["max/min held"] = f"{ratio:.2f} ({'/'.join(str(n) for n in counts.values())})"
        say(
            f"  held {'as planned' if assignment != 'acquire' else 'after drain/undrain'} "
            f"({rounds} drains, {time.monotonic() - started:.1f}s): "
            f"{counts}; "
            f"max/min {ratio:.2f} (target <= 1.5: {verdict(ratio <= 1.5)})"
        )
        acquired, took, ok, count = kill_most_loaded(engine, procs, counts, args.lease_ttl)
        figures["failover: acquired elsewhere"] = f"{acquired:.2f}s ({count} schedules)"
        figures["failover: fired elsewhere"] = f"{took:.2f}s" + ("" if ok else " (timed out)")
        say(f"  held after the failover: {held(engine)}")
        say(load_line())
    return figures


def kill_most_loaded(
    engine: Engine, procs: Processes, counts: dict[str, int], lease_ttl: float
) -> tuple[float, float, bool, int]:
    """kill -9 the scheduler holding the most; seconds until its schedules are acquired, and
    until each has fired elsewhere, whether that happened before the timeout, how many."""
    victim = max(counts, key=lambda n: counts[n])
    with engine.connect() as conn:
        ids = [
            r[0]
            for r in conn.execute(
                text(
                    "SELECT c.id FROM schedules c JOIN schedulers s ON s.id = c.owner "
                    "WHERE s.name = :n"
                ),
                {"n": victim},
            )
        ]
        since = conn.execute(text("SELECT now()")).scalar_one()
    procs.signal(victim, signal.SIGKILL)
    killed = time.monotonic()

    def taken() -> bool:
        with engine.connect() as conn:
            left = conn.execute(text(NOT_TAKEN), {"ids": ids, "victim": victim}).scalar_one()
        return int(left) == 0

    def moved() -> bool:
        with engine.connect() as conn:
            done = conn.execute(
                text(FIRED_ELSEWHERE), {"ids": ids, "victim": victim, "since": since}
            ).scalar_one()
        return int(done) == len(ids)

    wait_until(taken, timeout=lease_ttl * 5 + 10, interval=0.02)
    acquired = time.monotonic() - killed
    ok = wait_until(moved, timeout=lease_ttl * 5 + 60, interval=0.02)
    took = time.monotonic() - killed
    say(
        f"  kill -9 {victim} ({len(ids)} schedules): all acquired elsewhere in {acquired:.2f}s, "
        f"all fired elsewhere in {took:.2f}s (target <= lease TTL + 1 s = {lease_ttl + 1:g}s: "
        f"{verdict(ok and took <= lease_ttl + 1)})"
    )
    return acquired, took, ok, len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--schedulers", type=int, default=3)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--lease-ttl", type=float, default=3.0)
    parser.add_argument("--assignment", choices=["acquire", "scope", "both"], default="acquire")
    args = parser.parse_args()
    say(machine_line())
    say(load_line())
    strategies = ["acquire", "scope"] if args.assignment == "both" else [args.assignment]
    results = {name: measure(args, name) for name in strategies}
    if len(results) > 1:
        say("")
        say(f"| figure | {' | '.join(results)} |")
        say(f"|---|{'---|' * len(results)}")
        for figure in results[strategies[0]]:
            say(f"| {figure} | {' | '.join(r[figure] for r in results.values())} |")


if __name__ == "__main__":
    main()
