"""The scope strategy with real `sasflow scheduler` processes on PostgreSQL and RabbitMQ
(lease 4 s): 3 schedulers, 1,000 schedules each firing every second; kill -9 the leader, then
another scheduler, then add one back. The plan after each change matches the formula, and
across the whole test every tick fires exactly once: per schedule, the ticks fired are
consecutive seconds (none lost, even those due while a dead scheduler held it: catch-up `all`)
and each has exactly one run (counted by business key)."""

from __future__ import annotations

import contextlib
import itertools
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from bench import apps
from sasflow.ops import registrations as scheduler_ops
from sasflow.ops import schedules as schedule_ops
from sasflow.scheduler.cluster.plan import even_ranges
from sasflow.schedules.definition import Schedule
from sasflow.store.db import transaction
from sasflow.store.schema import runs, schedule_ticks
from sasflow.transport.topology import Names
from tests import harness
from tests.acceptance.processes import Processes

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

TTL = 4.0
K = 1000
ADDRESSES = {"A": "127.0.0.1", "B": "127.0.0.2", "C": "127.0.0.3", "D": "127.0.0.4"}


@pytest.fixture
def ticking(tmp_path: Path, database_url: str, names: Names) -> Iterator[Processes]:
    """Processes running bench.apps, whose `tick` workflow's requests expire after a second
    (no agent serves them: the broker does not fill up)."""
    procs = Processes(
        tmp_path, database_url=database_url, namespace=names.namespace, app="bench.apps"
    )
    try:
        yield procs
    finally:
        procs.stop_all()


def start(procs: Processes, name: str) -> None:
    procs.start(
        name,
        "scheduler",
        "--name",
        name,
        "--address",
        ADDRESSES[name],
        "--lease-ttl",
        str(TTL),
        "--assignment",
        "scope",
    )


def plan(engine: Engine) -> dict[str, Any]:
    with transaction(engine) as conn:
        return scheduler_ops.plan_view(conn)


def planned(engine: Engine, names: list[str]) -> bool:
    """The ready plan gives `names` (by address) the formula's ranges of the K schedules."""
    current = plan(engine)
    expected = list(zip(names, even_ranges(K, len(names)), strict=True))
    return (
        current["state"] == "ready"
        and [(r["name"], (r["first"], r["last"])) for r in current["ranges"]] == expected
    )


def now(engine: Engine) -> Any:
    """The database's clock (the ticks' fired_at is stamped by it)."""
    with engine.connect() as conn:
        return conn.execute(select(func.now())).scalar_one()


def wait_firing(engine: Engine, names: list[str], since: Any) -> None:
    """Wait until each of `names` fired a tick after `since`: ticks fire under the plan."""

    def fired() -> bool:
        with engine.connect() as conn:
            firers = conn.execute(
                select(schedule_ticks.c.fired_by)
                .where(schedule_ticks.c.fired_at > since)
                .distinct()
            ).scalars()
            return set(names) <= set(firers)

    harness.wait_for(fired, timeout=30, interval=0.2, what=f"ticks fired by {names}")


def wait_plan(engine: Engine, names: list[str], *, within: float) -> float:
    since = time.monotonic()
    harness.wait_for(lambda: planned(engine, names), timeout=within, what=f"plan {names}")
    return time.monotonic() - since


def test_three_scope_schedulers_lose_two_and_gain_one_and_every_tick_fires_once(
    ticking: Processes, engine: Engine
) -> None:
    procs = ticking
    for name in "ABC":
        start(procs, name)
    with transaction(engine) as conn:
        for number in range(K):
            schedule_ops.add(
                conn,
                Schedule(f"t{number:04d}", "tick", every=1, catch_up="all", max_catch_up=3600),
                apps.registry,
                actor="test",
                reason=None,
                namespace=procs.env["SASFLOW_NAMESPACE"],
            )
    wait_plan(engine, ["A", "B", "C"], within=30)
    # Ticks fire under the first plan. A fixed time, unlike the waits below: the leader's kill
    # is timed against TTL + 1 s, a bound already missed now and then by a tenth of a second,
    # and killing it sooner after the start could only make that likelier.
    time.sleep(2)

    # kill -9 the leader: another takes the lead and reshards within TTL + 1 s.
    harness.wait_for(lambda: plan(engine)["leader"] is not None, timeout=10, what="a leader")
    leader = plan(engine)["leader"]
    procs.signal(leader, signal.SIGKILL)
    alive = [n for n in "ABC" if n != leader]
    took = wait_plan(engine, alive, within=TTL + 10)
    resharded = now(engine)
    assert took <= TTL + 1.0, f"the new leader's plan took {took:.2f}s"
    assert plan(engine)["leader"] in alive
    wait_firing(engine, alive, since=resharded)

    # kill -9 a scheduler that does not lead: the leader reshards.
    victim = next(n for n in alive if n != plan(engine)["leader"])
    procs.signal(victim, signal.SIGKILL)
    (survivor,) = [n for n in alive if n != victim]
    wait_plan(engine, [survivor], within=TTL + 10)
    wait_firing(engine, [survivor], since=now(engine))

    # Add one back: it joins the plan (by address).
    start(procs, "D")
    wait_plan(engine, sorted([survivor, "D"], key=ADDRESSES.__getitem__), within=30)
    wait_firing(engine, [survivor, "D"], since=now(engine))
    listed = procs.run("schedulers", "plan")
    assert listed.returncode == 0, listed.stderr
    assert "ready" in listed.stdout
    for name in (survivor, "D"):
        procs.signal(name, signal.SIGTERM)
        with contextlib.suppress(Exception):
            procs.wait(name, timeout=30)

    with engine.connect() as conn:
        ticks = conn.execute(
            select(
                schedule_ticks.c.schedule_id, schedule_ticks.c.tick_at, schedule_ticks.c.fired_by
            ).order_by(schedule_ticks.c.schedule_id, schedule_ticks.c.tick_at)
        ).all()
        per_key = conn.execute(
            select(runs.c.business_key, func.count()).group_by(runs.c.business_key)
        ).all()
    assert {count for _, count in per_key} == {1}  # one run per (schedule, tick)
    assert len(per_key) == len(ticks)
    by_schedule = {
        sid: [t.tick_at for t in rows]
        for sid, rows in itertools.groupby(ticks, key=lambda t: t.schedule_id)
    }
    # 1,000 ticks a second is more than a loaded 2-core machine fires (docs/cluster.md,
    # Figures): schedules fall behind, oldest tick first, so the check is per schedule over
    # what it fired: consecutive seconds from its first tick (none lost, none twice).
    for sid, fired in by_schedule.items():
        gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(fired)}
        assert gaps <= {1.0}, f"schedule {sid}: gaps {sorted(gaps)}"
    # Every scheduler fired under one plan or another, the one added back included.
    assert {t.fired_by for t in ticks} >= {survivor, "D"}
