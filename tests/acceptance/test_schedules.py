"""The issue's walk-through with real `sasflow scheduler` processes on PostgreSQL (lease 2 s):
one scheduler holds everything and raises the overload alarm past M; a second one leaves what
the first holds alone; its kill -9 hands its schedules back within the lease + 1 s; with three
schedulers of tolerance 1 and K=21, the one holding 11 is at its limit N=11 and refuses more.
`sasflow schedulers list` shows K, S, N, X, M at each point."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from sasflow.ops import registrations as scheduler_ops
from sasflow.ops import schedules as schedule_ops
from sasflow.registry import Registry
from sasflow.schedules.definition import Schedule
from sasflow.store.db import transaction
from sasflow.store.schema import alerts, schedulers, schedules
from tests import harness
from tests.acceptance.processes import Processes
from tests.apps import basic

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

TTL = 2.0


def cluster(procs: Processes) -> dict[str, dict[str, Any]]:
    """`sasflow schedulers list -o json`, by scheduler name (the operator's view)."""
    result = procs.run("schedulers", "list", "-o", "json")
    assert result.returncode == 0, result.stderr
    return {row["name"]: row for row in json.loads(result.stdout)}


def online(engine: Engine) -> set[str]:
    """The online schedulers of the same view, read in the test's process: polled by the waits
    (a `sasflow` process per poll would take a second each)."""
    with transaction(engine) as conn:
        return {r["name"] for r in scheduler_ops.cluster_view(conn) if r["state"] == "online"}


def figures(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["state"], row["K"], row["S"], row["N"], row["X"], row["M"])


def held(engine: Engine) -> dict[str, int]:
    """X per live scheduler name, and the unowned count under None, from the rows."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(schedulers.c.name, func.count(schedules.c.id))
            .select_from(schedules.outerjoin(schedulers, schedulers.c.id == schedules.c.owner))
            .group_by(schedulers.c.name)
        ).all()
    return dict(rows)


def add(engine: Engine, names: list[str], namespace: str) -> list[int]:
    registry = Registry([basic.pipeline], [basic.echo])
    with transaction(engine) as conn:
        return [
            schedule_ops.add(
                conn,
                Schedule(name, "pipeline", every=3600, input={"text": name}),
                registry,
                actor="test",
                reason="walk-through",
                namespace=namespace,
            )["id"]
            for name in names
        ]


def start(procs: Processes, name: str, *options: str) -> None:
    procs.start(name, "scheduler", "--name", name, "--lease-ttl", str(TTL), *options)


def test_walk_through(procs: Processes, engine: Engine) -> None:
    namespace = procs.env["SASFLOW_NAMESPACE"]
    start(procs, "A", "--alarm-threshold", "10")
    add(engine, [f"s{i}" for i in range(1, 10)], namespace)
    harness.wait_for(lambda: held(engine) == {"A": 9}, timeout=30, what="A holds the 9")
    assert figures(cluster(procs)["A"]) == ("online", 9, 1, 10, 9, 10)

    # Two more: A holds 11 > M=10 and raises the overload alarm.
    add(engine, ["s10", "s11"], namespace)
    harness.wait_for(lambda: held(engine) == {"A": 11}, timeout=10, what="A holds 11")
    harness.wait_for(lambda: _open_alarms(engine) == ["A"], timeout=10, what="the alarm")
    assert figures(cluster(procs)["A"]) == ("online", 11, 1, 12, 11, 10)

    # B (M=8) joins: what A holds stays with A; new schedules go to whichever acquires.
    start(procs, "B", "--alarm-threshold", "8")
    harness.wait_for(lambda: "B" in online(engine), timeout=20, what="B registered")
    assert held(engine) == {"A": 11}
    added = add(engine, ["s12", "s13"], namespace)
    harness.wait_for(lambda: None not in held(engine), timeout=10, what="new ones acquired")
    for attempt in range(50):  # B must hold some, whoever won the new ones: release them
        if held(engine).get("B"):
            break
        with transaction(engine) as conn:  # what `sasflow schedules release ID` does
            schedule_ops.release(
                conn, str(added[attempt % 2]), actor="test", reason=None, namespace=namespace
            )
        harness.wait_for(lambda: None not in held(engine), timeout=10, what="re-acquired")
    by_b = held(engine).get("B", 0)
    assert by_b >= 1
    view = cluster(procs)
    assert figures(view["B"]) == ("online", 13, 2, 14, by_b, 8)

    # kill -9 B: A takes B's schedules within the lease TTL + 1 s.
    procs.signal("B", signal.SIGKILL)
    killed = time.monotonic()
    harness.wait_for(lambda: held(engine) == {"A": 13}, timeout=10, what="A takes over")
    took = time.monotonic() - killed
    assert took <= TTL + 1.0, f"failover took {took:.2f}s"
    view = cluster(procs)
    assert view["B"]["state"] == "dead"
    assert figures(view["A"]) == ("online", 13, 1, 14, 13, 10)

    # Back to K=11 held by A; B2 and C join (tolerance 1); K becomes 21: N=11 for each, and
    # A, holding 11, refuses more: the 10 new go to B2 and C.
    with transaction(engine) as conn:
        for schedule_id in added:
            schedule_ops.remove(
                conn, str(schedule_id), actor="test", reason=None, namespace=namespace
            )
    start(procs, "B2")
    start(procs, "C")
    harness.wait_for(lambda: {"B2", "C"} <= online(engine), timeout=20, what="B2 and C registered")
    add(engine, [f"t{i}" for i in range(1, 11)], namespace)
    harness.wait_for(lambda: None not in held(engine), timeout=10, what="K=21 held")
    counts = held(engine)
    assert counts["A"] == 11
    assert counts.get("B2", 0) + counts.get("C", 0) == 10
    view = cluster(procs)
    assert figures(view["A"]) == ("online", 21, 3, 11, 11, 10)
    assert {view[n]["N"] for n in ("B2", "C")} == {11}
    procs.assert_alive_except("B")


def _open_alarms(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(alerts.c.detail).where(
                alerts.c.kind == "scheduler_overloaded", alerts.c.acknowledged.is_(False)
            )
        ).scalars()
        return [detail["scheduler"] for detail in rows]
