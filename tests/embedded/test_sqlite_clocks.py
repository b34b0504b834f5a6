"""The clocks and run deadlines on the embedded store (SQLite): the portable statements that
start a step, push its heartbeat clock, tell its expired clocks apart and fire a deadline."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select, update

from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent
from sasflow.commands import StepProgress
from sasflow.store.cluster.lease import SUPERVISOR_LEASE, Lease
from sasflow.store.db import transaction
from sasflow.store.runs.claim import claim_steps
from sasflow.store.runs.progress import apply_progress
from sasflow.store.runs.sweeps import SweepReport
from sasflow.store.schema import alerts, runs, steps
from sasflow.store.sqltime import now, plus_seconds
from sasflow.supervisor.deadlines import sweep_deadlines
from sasflow.supervisor.sweep import sweep_expired


def _registry(**workflow: Any) -> Registry:
    agent = Agent("svc")
    agent.add_handler("go", lambda _call: None)
    policy = StepPolicy(timeout=60, wait_timeout=10, heartbeat_timeout=2)
    return Registry(
        [Workflow("w", [Step("only", "svc", "go", policy=policy)], **workflow)], [agent]
    )


def _claim_one(engine: Engine, key: str, **workflow: Any) -> Any:
    registry = _registry(**workflow)
    with engine.begin() as conn:
        submit_run(conn, registry, "w", {}, key=key, namespace="t")
    with transaction(engine) as conn:
        (claimed,) = claim_steps(conn, locked_by="s", batch=1)
    return claimed


def _step(engine: Engine, step_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(steps).where(steps.c.id == step_id)).one()


def test_started_and_heartbeat_run_the_clocks_on_sqlite(sqlite_engine: Engine) -> None:
    claimed = _claim_one(sqlite_engine, "a")
    envelope = _step(sqlite_engine, claimed.id).complete_by
    with transaction(sqlite_engine) as conn:
        stale = apply_progress(
            conn, [StepProgress(claimed.id, 9, started=True)], actor="s", finished=set()
        )
        report = apply_progress(
            conn, [StepProgress(claimed.id, 1, started=True)], actor="s", finished=set()
        )
    row = _step(sqlite_engine, claimed.id)
    assert (stale.started, report.started) == (0, 1)
    assert row.started_at is not None
    assert (row.complete_by - row.started_at).total_seconds() == 2  # the heartbeat clock
    assert row.complete_by < envelope
    with transaction(sqlite_engine) as conn:
        beat = apply_progress(
            conn, [StepProgress(claimed.id, 1, started=False)], actor="s", finished=set()
        )
    assert beat.heartbeats == 1
    assert _step(sqlite_engine, claimed.id).complete_by >= row.complete_by


def test_the_sweep_tells_the_clocks_apart_on_sqlite(sqlite_engine: Engine) -> None:
    """Unstarted past its envelope: pending, uncharged; started past its heartbeat clock: one
    failure."""
    waiting = _claim_one(sqlite_engine, "waiting")
    started = _claim_one(sqlite_engine, "started")
    with sqlite_engine.begin() as conn:
        conn.execute(
            update(steps)
            .where(steps.c.id == waiting.id)
            .values(complete_by=plus_seconds(now(), -1))
        )
        conn.execute(
            update(steps)
            .where(steps.c.id == started.id)
            .values(started_at=plus_seconds(now(), -5), complete_by=plus_seconds(now(), -3))
        )
    lease = Lease("sup", name=SUPERVISOR_LEASE, ttl=60)
    assert lease.acquire(sqlite_engine)
    report = SweepReport()
    sweep_expired(
        sqlite_engine, lease, batch=10, budget=5, actor="sup", report=report, namespace="t"
    )
    assert (report.waited, report.reclaimed) == (1, 1)
    unstarted, dead = _step(sqlite_engine, waiting.id), _step(sqlite_engine, started.id)
    assert (unstarted.state, unstarted.failure_count, unstarted.wait_expiries) == ("pending", 0, 1)
    assert unstarted.error["type"] == "WaitTimeout"
    assert (dead.state, dead.failure_count, dead.error["type"]) == (
        "pending",
        1,
        "HeartbeatTimeout",
    )
    assert (unstarted.started_at, dead.started_at) == (None, None)


def test_a_deadline_fires_once_on_sqlite(sqlite_engine: Engine) -> None:
    registry = _registry(deadline=30, on_deadline="alert")
    with sqlite_engine.begin() as conn:
        run = submit_run(conn, registry, "w", {}, key="late", namespace="t")
        conn.execute(
            update(runs).where(runs.c.id == run.run_id).values(deadline_at=plus_seconds(now(), -1))
        )
    lease = Lease("sup", name=SUPERVISOR_LEASE, ttl=60)
    assert lease.acquire(sqlite_engine)
    reports = [SweepReport(), SweepReport()]
    for report in reports:
        sweep_deadlines(
            sqlite_engine, lease, batch=10, budget=5, actor="sup", report=report, namespace="t"
        )
    assert [r.deadlines for r in reports] == [1, 0]
    with sqlite_engine.connect() as conn:
        kinds = conn.execute(select(alerts.c.kind)).scalars().all()
        fired = conn.execute(select(runs.c.deadline_fired_at)).scalar_one()
    assert kinds == ["run_deadline"]
    assert fired is not None
