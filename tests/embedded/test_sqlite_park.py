"""Parked steps on the SQLite state store (the embedded default): the same statements park a
step whose failures ran out, and unpark and fail act on it as on PostgreSQL."""

from __future__ import annotations

from sqlalchemy import Engine, select

from sasflow.ops import park
from sasflow.states import RunState, StepState
from sasflow.store.schema import alerts, runs, steps
from tests.parking import park_by_failures


def _states(engine: Engine, run_id: int) -> tuple[str, str]:
    with engine.connect() as conn:
        run = conn.execute(select(runs.c.state).where(runs.c.id == run_id)).scalar_one()
        step = conn.execute(select(steps.c.state).where(steps.c.run_id == run_id)).scalar_one()
    return run, step


def test_a_step_parks_and_is_unparked_or_failed_on_sqlite(sqlite_engine: Engine) -> None:
    unparked = park_by_failures(sqlite_engine, key="a")
    failed = park_by_failures(sqlite_engine, key="b")
    assert _states(sqlite_engine, unparked) == (RunState.RUNNING, StepState.PARKED)
    with sqlite_engine.begin() as conn:
        park.unpark_run(conn, unparked, actor="ann", reason="fixed", namespace="t")
        park.fail_run(conn, failed, actor="ann", reason="void", namespace="t")
    assert _states(sqlite_engine, unparked) == (RunState.RUNNING, StepState.PENDING)
    assert _states(sqlite_engine, failed) == (RunState.ERROR, StepState.ERROR)
    with sqlite_engine.connect() as conn:
        kinds = conn.execute(
            select(alerts.c.kind, alerts.c.acknowledged)
            .where(alerts.c.run_id.is_not(None))  # not the incidents' notices
            .order_by(alerts.c.id)
        )
        assert [tuple(r) for r in kinds] == [
            ("step_parked", True),
            ("step_parked", True),
            ("step_failed", False),
        ]
