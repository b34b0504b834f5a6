"""Parked steps on PostgreSQL (docs/operations.md "Parked steps"): a step whose failures run
out (a `failed` reply at the threshold, a supervisor expiry) or that answers a permanent error
parks when its policy says so: the run is not failed, a `step_parked` alert is raised; an
operator unparks the run (the step is pending with a fresh failure budget and the run can
complete) or fails it (the run ends as it would have: error, or compensation). Each is in the
run's timeline with the actor and the reason, and resolves the alert."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select, update

from sasflow.commands import StepOutcome
from sasflow.errors import InvalidActionError
from sasflow.ops import park
from sasflow.ops.cancel import cancel
from sasflow.ops.runs import show_run
from sasflow.states import ReplyStatus, RunState, StepState
from sasflow.store.cluster.lease import SUPERVISOR_LEASE, Lease
from sasflow.store.db import transaction
from sasflow.store.runs.apply import apply_outcomes
from sasflow.store.runs.sweeps import SweepReport
from sasflow.store.schema import alerts, runs, steps
from sasflow.store.sqltime import now
from sasflow.supervisor.sweep import sweep_expired
from tests.apps import parking
from tests.parking import DOWN, answer, claim, park_by_failures, submit

pytestmark = pytest.mark.integration


def _state(engine: Engine, run_id: int) -> tuple[str, dict[str, tuple[str, int]]]:
    with engine.connect() as conn:
        run = conn.execute(select(runs.c.state).where(runs.c.id == run_id)).scalar_one()
        rows = conn.execute(
            select(steps.c.name, steps.c.kind, steps.c.state, steps.c.failure_count).where(
                steps.c.run_id == run_id
            )
        ).all()
    return run, {f"{r.kind}:{r.name}": (r.state, r.failure_count) for r in rows}


def _alerts(engine: Engine, run_id: int) -> list[tuple[str, bool]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(alerts.c.kind, alerts.c.acknowledged)
            .where(alerts.c.run_id == run_id)
            .order_by(alerts.c.id)
        ).all()
    return [(r.kind, r.acknowledged) for r in rows]


def test_a_step_whose_failures_run_out_parks_and_unparking_lets_the_run_complete(
    engine: Engine,
) -> None:
    run_id = park_by_failures(engine)
    assert _state(engine, run_id) == (RunState.RUNNING, {"forward:call": ("parked", 2)})
    assert _alerts(engine, run_id) == [("step_parked", False)]
    assert claim(engine) == []  # no claim takes a parked step
    with engine.begin() as conn:
        done = park.unpark_run(conn, run_id, actor="ann", reason="partner fixed", namespace="t")
    assert done == {"run_id": run_id, "state": "running", "steps": ["call"], "changed": True}
    assert _state(engine, run_id) == (RunState.RUNNING, {"forward:call": ("pending", 0)})
    assert _alerts(engine, run_id) == [("step_parked", True)]
    with engine.begin() as conn:  # nothing is parked any more: a no-op, not recorded
        again = park.unpark_run(conn, run_id, actor="ann", reason="twice", namespace="t")
    assert again["changed"] is False
    answer(engine, ReplyStatus.OK, {"called": "k"})
    assert _state(engine, run_id) == (RunState.COMPLETED, {"forward:call": ("processed", 0)})
    with engine.connect() as conn:
        timeline = [
            (e["to_state"], e["actor"], e["reason"])
            for e in show_run(conn, run_id)["events"]
            if e["entity"] == "step"
        ]
    assert ("parked", "s1", "failed") in timeline
    assert ("pending", "ann", "unparked: partner fixed") in timeline
    assert timeline.count(("pending", "ann", "unparked: twice")) == 0


def test_failing_a_parked_run_ends_it_in_error_with_the_step_failed_alert(
    engine: Engine,
) -> None:
    run_id = park_by_failures(engine)
    with engine.begin() as conn, pytest.raises(InvalidActionError, match="reason"):
        park.fail_run(conn, run_id, actor="ann", reason=" ", namespace="t")
    with engine.begin() as conn:
        done = park.fail_run(conn, run_id, actor="ann", reason="order void", namespace="t")
    assert done == {"run_id": run_id, "state": "error", "steps": ["call"], "changed": True}
    assert _state(engine, run_id) == (RunState.ERROR, {"forward:call": ("error", 2)})
    assert _alerts(engine, run_id) == [("step_parked", True), ("step_failed", False)]
    with engine.begin() as conn, pytest.raises(InvalidActionError, match="no parked step"):
        park.fail_run(conn, run_id, actor="ann", reason="again", namespace="t")
    with engine.connect() as conn:
        run = show_run(conn, run_id)
    assert run["run"]["error"]["step"] == "call"
    assert ("error", "ann", "failed: order void") in [
        (e["to_state"], e["actor"], e["reason"]) for e in run["events"] if e["entity"] == "step"
    ]


def test_failing_a_parked_run_that_compensates_undoes_its_processed_steps(
    engine: Engine,
) -> None:
    run_id = park_by_failures(engine, "parks_compensates")
    assert _state(engine, run_id)[1]["forward:call"] == ("parked", 2)
    with engine.begin() as conn:
        done = park.fail_run(conn, run_id, actor="ann", reason="give up", namespace="t")
    assert done["state"] == RunState.COMPENSATING
    answer(engine, ReplyStatus.OK)  # the compensation of `first`
    state, by_step = _state(engine, run_id)
    assert state == RunState.COMPENSATED
    assert by_step["compensation:first"][0] == StepState.PROCESSED


def test_a_permanent_error_parks_unless_the_workflow_fails_errors(engine: Engine) -> None:
    parked = submit(engine, "parks", "p")
    failed = submit(engine, "errors_fail", "f")
    answer(engine, ReplyStatus.ERROR)
    assert _state(engine, parked) == (RunState.RUNNING, {"forward:call": ("parked", 0)})
    assert _state(engine, failed) == (RunState.ERROR, {"forward:call": ("error", 0)})
    assert _alerts(engine, parked) == [("step_parked", False)]


def test_a_step_policy_parks_and_a_workflow_without_parking_fails(engine: Engine) -> None:
    parked = submit(engine, "step_parks", "p")
    failed = submit(engine, "fails", "f")
    for _ in range(2):
        answer(engine, ReplyStatus.FAILED)
    assert _state(engine, parked) == (RunState.RUNNING, {"forward:call": ("parked", 2)})
    assert _state(engine, failed) == (RunState.ERROR, {"forward:call": ("error", 2)})


def test_a_step_expired_by_the_supervisor_at_its_threshold_parks(engine: Engine) -> None:
    run_id = submit(engine, "parks")
    lease = Lease("sup", name=SUPERVISOR_LEASE, ttl=30.0)
    assert lease.acquire(engine)
    report = SweepReport()
    for _ in range(2):
        assert claim(engine)
        with engine.begin() as conn:  # the agent started it, then its execution clock ran out
            conn.execute(
                update(steps)
                .where(steps.c.run_id == run_id)
                .values(started_at=now(), complete_by=now())
            )
        sweep_expired(
            engine, lease, batch=10, budget=10.0, actor="sup", report=report, namespace="t"
        )
    assert report.parked == 1
    assert report.escalated == 0
    assert len(report.alerts) == 1
    assert _state(engine, run_id) == (RunState.RUNNING, {"forward:call": ("parked", 2)})
    assert _alerts(engine, run_id) == [("step_parked", False)]


def test_cancelling_a_parked_run_cancels_its_parked_step(engine: Engine) -> None:
    run_id = park_by_failures(engine)
    with engine.begin() as conn:
        done = cancel(conn, run_id, actor="ann", reason="no longer wanted", namespace="t")
    assert done.cancelled_steps == ("call",)
    assert _state(engine, run_id) == (RunState.CANCELLED, {"forward:call": ("cancelled", 2)})


def test_a_parked_step_of_a_run_that_fails_at_another_step_is_skipped_and_its_alert_closed(
    engine: Engine,
) -> None:
    run_id = submit(engine, "siblings")  # two roots; errors fail, exhausted steps park
    answer(engine, ReplyStatus.FAILED)  # both: one failure each
    claimed = {c.name: c for c in claim(engine)}
    for name, kind in (("call", ReplyStatus.FAILED), ("other", ReplyStatus.ERROR)):
        outcome = StepOutcome(
            step_id=claimed[name].id, attempt=claimed[name].attempt, kind=kind, error=DOWN
        )
        with transaction(engine) as conn:
            apply_outcomes(conn, parking.registry, [outcome], namespace="t", actor="s1")
        if name == "call":
            assert _alerts(engine, run_id) == [("step_parked", False)]
    assert _state(engine, run_id) == (
        RunState.ERROR,
        {"forward:call": ("skipped", 2), "forward:other": ("error", 1)},
    )
    assert _alerts(engine, run_id) == [("step_parked", True), ("step_failed", False)]
