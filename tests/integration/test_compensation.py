"""Compensation: a failed run undoes its processed steps in reverse order, as supervised steps;
a compensation that fails for good leaves the run for an operator, with an alert."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine, select

from sasflow import Backoff, Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent
from sasflow.messages import ErrorInfo, Reply
from sasflow.ops.resubmit import resubmit
from sasflow.store.runs.apply import apply_outcomes
from sasflow.store.runs.claim import claim_steps
from sasflow.store.schema import alerts, runs
from sasflow.transport.topology import Names
from tests import harness
from tests.apps.travel import travel

pytestmark = pytest.mark.integration


def _run(
    engine: Engine, database_url: str, names: Names, registry: Registry, until: set[str]
) -> int:
    with engine.begin() as conn:
        run = submit_run(
            conn, registry, "trip", {"who": "ada"}, key="trip-1", namespace=names.namespace
        )
    agent = next(a for a in registry.agents if isinstance(a, Agent))
    with harness.running(
        harness.scheduler(engine, database_url, registry, names), harness.agent(agent, names)
    ):
        harness.wait_for(
            lambda: set(harness.run_states(engine).values()) <= until, what=f"run reaches {until}"
        )
    return run.run_id


def test_third_step_failing_compensates_the_second_then_the_first(
    engine: Engine, database_url: str, names: Names
) -> None:
    registry, calls, _ = travel()
    run_id = _run(engine, database_url, names, registry, {"compensated"})
    assert [c[0] for c in calls] == ["book", "book", "book", "cancel", "cancel"]
    undone = [c[1]["output"]["reference"].split("-")[0] for c in calls if c[0] == "cancel"]
    assert undone == ["hotel", "flight"]
    assert all(c[1]["input"] == {"who": "ada"} for c in calls if c[0] == "cancel")
    by_kind = {(r.kind, r.name): r.state for r in harness.step_rows(engine, run_id)}
    assert by_kind == {
        ("forward", "flight"): "processed",
        ("forward", "hotel"): "processed",
        ("forward", "car"): "error",
        ("compensation", "hotel"): "processed",
        ("compensation", "flight"): "processed",
    }
    with engine.connect() as conn:
        run = conn.execute(select(runs).where(runs.c.id == run_id)).one()
        raised = conn.execute(select(alerts.c.kind)).scalars().all()
    assert run.finished_at is not None
    assert run.error["step"] == "car"
    assert raised == []  # compensated on purpose: nothing for an operator


def test_a_failing_compensation_ends_in_the_operator_state_with_an_alert(
    engine: Engine, database_url: str, names: Names
) -> None:
    registry, calls, _ = travel("flight")
    run_id = _run(engine, database_url, names, registry, {"compensation_failed"})
    assert [c[0] for c in calls] == ["book", "book", "book", "cancel", "cancel"]
    with engine.connect() as conn:
        run = conn.execute(select(runs).where(runs.c.id == run_id)).one()
        raised = conn.execute(select(alerts.c.kind, alerts.c.message)).all()
    assert run.error["compensation"] is True
    assert run.error["step"] == "flight"
    assert [a.kind for a in raised] == ["compensation_failed"]
    assert "needs an operator" in raised[0].message


def test_resubmitting_a_run_whose_compensation_failed_retries_the_compensation(
    engine: Engine, database_url: str, names: Names
) -> None:
    """The operator fixes what blocked the undo and resubmits: only the failed compensation
    runs again, the forward steps do not, and the run ends compensated."""
    registry, calls, broken = travel("flight")
    run_id = _run(engine, database_url, names, registry, {"compensation_failed"})
    broken.clear()
    with engine.begin() as conn:
        done = resubmit(
            conn, registry, run_id, actor="ops", reason="airline fixed", namespace=names.namespace
        )
    assert (done.reset_steps, done.ready_steps) == (("flight",), ("flight",))
    agent = next(a for a in registry.agents if isinstance(a, Agent))
    with harness.running(
        harness.scheduler(engine, database_url, registry, names), harness.agent(agent, names)
    ):
        harness.wait_for(
            lambda: harness.run_states(engine) == {run_id: "compensated"},
            what="compensation completes",
        )
    assert [c[0] for c in calls] == ["book"] * 3 + ["cancel"] * 3
    with engine.connect() as conn:
        open_alerts = conn.execute(
            select(alerts.c.id).where(alerts.c.acknowledged.is_(False))
        ).all()
    assert open_alerts == []


def test_a_step_retrying_an_unknown_outcome_is_finished_and_undone_before_compensating(
    engine: Engine, names: Names
) -> None:
    """Steps a, b, c run in parallel; a succeeds, c's attempt fails transiently (so it waits to
    retry, outcome of its first attempt unknown), b fails for good: compensation waits for c's
    retry, which is still dispatched although the run is compensating, and then undoes a and c."""
    agent = Agent("par")
    for action in ("do", "undo"):
        agent.add_handler(action, lambda _call: None)
    fast = StepPolicy(timeout=5, max_failures=3, backoff=Backoff(initial=0.05, maximum=0.05))
    flow = Workflow(
        "par",
        [Step(n, "par", "do", after=(), compensate="undo", policy=fast) for n in ("a", "b", "c")],
        on_failure="compensate",
    )
    registry = Registry([flow], [agent])
    with engine.begin() as conn:
        run = submit_run(conn, registry, "par", {}, key="p", namespace=names.namespace)

    def claim() -> dict[str, int]:
        with engine.begin() as conn:
            return {c.name: c.id for c in claim_steps(conn, locked_by="t", batch=10)}

    def reply(step_id: int, attempt: int, status: str) -> None:
        error = None if status == "ok" else ErrorInfo(type="X", message=status)
        with engine.begin() as conn:
            apply_outcomes(
                conn,
                registry,
                [Reply(step_id=step_id, attempt=attempt, status=status, error=error).outcome()],
                namespace=names.namespace,
                actor="t",
            )

    ids = claim()
    reply(ids["a"], 1, "ok")
    reply(ids["c"], 1, "failed")
    reply(ids["b"], 1, "error")
    assert harness.run_states(engine) == {run.run_id: "compensating"}
    kinds = {(r.kind, r.name): r.state for r in harness.step_rows(engine, run.run_id)}
    assert ("compensation", "a") not in kinds, "compensation started before c was known"
    time.sleep(0.1)  # c's backoff
    assert claim() == {"c": ids["c"]}
    reply(ids["c"], 2, "ok")
    chain = [r.name for r in harness.step_rows(engine, run.run_id) if r.kind == "compensation"]
    assert sorted(chain) == ["a", "c"]
