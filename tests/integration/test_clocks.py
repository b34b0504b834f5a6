"""The three clocks on PostgreSQL and RabbitMQ, with the real roles in threads: the execution
clock charges a handler that overruns, the heartbeat clock finds a silent handler in seconds
and lets a heartbeating one run on, time waiting in the queue is not taken from the agent's
budget, and progress messages are fenced by the attempt. (An agent absent past the wait clock:
tests/contract/test_engine_contract.py, on every store and bus; an agent process killed under a
heartbeat clock: tests/acceptance/test_clocks.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update

from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.commands import StepProgress
from sasflow.store.db import transaction
from sasflow.store.dialect import capabilities, with_capabilities
from sasflow.store.runs.claim import claim_steps
from sasflow.store.runs.progress import apply_progress
from sasflow.store.schema import events, steps
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration


@pytest.fixture
def supervisor(engine: Engine, names: Names) -> Iterator[Supervisor]:
    role = Supervisor(
        engine,
        names,
        transport=harness.transport("supervisor"),
        options=SupervisorOptions(interval=0.1),
    )
    yield role
    role.close()


def _one_step(agent: Agent, action: str, policy: StepPolicy) -> Registry:
    return Registry(
        [Workflow("clocked", [Step("only", agent.name, action, policy=policy)])], [agent]
    )


def _submit(engine: Engine, registry: Registry, names: Names, run_input: Any = None) -> int:
    with engine.begin() as conn:
        run = submit_run(
            conn, registry, "clocked", run_input or {}, key="c", namespace=names.namespace
        )
    return run.run_id


def _step_events(engine: Engine) -> list[tuple[str, str, str | None, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(events.c.from_state, events.c.to_state, events.c.reason, events.c.detail)
            .where(events.c.entity == "step")
            .order_by(events.c.id)
        ).all()
    return [tuple(r) for r in rows]


def test_a_handler_past_its_timeout_is_charged_one_failure_on_the_execution_clock(
    engine: Engine, database_url: str, names: Names, supervisor: Supervisor
) -> None:
    """The agent says `started`; its handler overruns the 0.5 s timeout (the wait clock is 30
    s): the supervisor charges one failure, `ExecutionTimeout`, soon after the timeout and
    long before the 30.5 s envelope."""
    agent = Agent("overrun")

    @agent.handler("hang")
    def hang(call: Call) -> None:
        call.cancelled.wait(10)  # set when the agent abandons the call at its deadline

    registry = _one_step(agent, "hang", StepPolicy(timeout=0.5, max_failures=1))
    run_id = _submit(engine, registry, names)
    began = time.monotonic()
    with harness.running(
        harness.scheduler(engine, database_url, registry, names, rescan_interval=0.1),
        harness.agent(agent, names),
        supervisor,
    ):
        harness.wait_for(
            lambda: harness.run_states(engine) == {run_id: "error"}, timeout=15, what="run error"
        )
    took = time.monotonic() - began
    (step,) = harness.step_rows(engine)
    assert (step.state, step.failure_count, step.attempt) == ("error", 1, 1)
    assert step.error == {
        "type": "ExecutionTimeout",
        "message": "execution clock: no reply within the step's timeout of 0.5 s after the "
        "agent started it",
    }
    assert took < 10, f"judged by the envelope, not the execution clock ({took:.1f} s)"
    assert [(e[0], e[1], e[2]) for e in _step_events(engine)] == [
        ("pending", "processing", None),
        ("processing", "processing", "started"),
        ("processing", "error", "expired"),
    ]
    assert _step_events(engine)[1][3] == {"agent": "overrun"}


def test_a_silent_handler_is_found_by_its_heartbeat_clock_long_before_its_timeout(
    engine: Engine, database_url: str, names: Names, supervisor: Supervisor
) -> None:
    """Timeout 60 s, heartbeat timeout 1 s, a handler that hangs without a heartbeat: one
    failure, `HeartbeatTimeout`, within a few seconds."""
    agent = Agent("mute")

    @agent.handler("hang")
    def hang(call: Call) -> None:
        call.cancelled.wait(60)

    policy = StepPolicy(timeout=60, heartbeat_timeout=1, max_failures=1)
    registry = _one_step(agent, "hang", policy)
    run_id = _submit(engine, registry, names)
    with harness.running(
        harness.scheduler(engine, database_url, registry, names, rescan_interval=0.1),
        harness.agent(agent, names),
        supervisor,
    ):
        harness.wait_for(
            lambda: harness.step_rows(engine)[0].started_at is not None, what="the step starts"
        )
        started = time.monotonic()
        harness.wait_for(
            lambda: harness.run_states(engine) == {run_id: "error"}, timeout=10, what="run error"
        )
        found_after = time.monotonic() - started
    (step,) = harness.step_rows(engine)
    assert (step.failure_count, step.error) == (
        1,
        {"type": "HeartbeatTimeout", "message": "heartbeat clock: no heartbeat for 1 s"},
    )
    assert found_after < 5, f"found after {found_after:.1f} s"


def test_a_heartbeating_handler_runs_past_its_heartbeat_timeout_and_completes(
    engine: Engine, database_url: str, names: Names, supervisor: Supervisor
) -> None:
    """Heartbeat timeout 1 s, a handler of 3 s that heartbeats often: no failure; the agent
    sends at most one heartbeat per third of the heartbeat timeout."""
    agent = Agent("beating")

    @agent.handler("work")
    def work(call: Call) -> dict[str, str]:
        until = time.monotonic() + 3
        while time.monotonic() < until:
            call.heartbeat()
            time.sleep(0.02)
        return {"done": "yes"}

    policy = StepPolicy(timeout=60, heartbeat_timeout=1, max_failures=1)
    registry = _one_step(agent, "work", policy)
    run_id = _submit(engine, registry, names)
    worker = harness.agent(agent, names)
    scheduler = harness.scheduler(engine, database_url, registry, names, rescan_interval=0.1)
    with harness.running(scheduler, worker, supervisor):
        harness.wait_for(
            lambda: harness.run_states(engine) == {run_id: "completed"},
            timeout=10,
            what="run completes",
        )
    (step,) = harness.step_rows(engine)
    assert (step.state, step.failure_count, step.attempt) == ("processed", 0, 1)
    assert 6 <= worker.stats.heartbeats <= 10, worker.stats  # ~3 per second for 3 s
    assert scheduler.stats.heartbeats >= 6
    assert scheduler.stats.started == 1


def test_time_waiting_in_the_queue_is_not_deducted_from_the_agents_budget(
    engine: Engine, database_url: str, names: Names, supervisor: Supervisor
) -> None:
    """The request waits 2 s for an agent (wait clock 20 s); the handler then has its whole
    3 s timeout, and takes 2 s of it: 4 s after the dispatch, past the timeout counted from
    the claim, its reply is applied and nothing is charged."""
    agent = Agent("late")
    remaining: list[float] = []

    @agent.handler("work")
    def work(call: Call) -> None:
        remaining.append(call.remaining())
        time.sleep(2)

    policy = StepPolicy(timeout=3, wait_timeout=20, max_failures=1)
    registry = _one_step(agent, "work", policy)
    run_id = _submit(engine, registry, names)
    scheduler = harness.scheduler(engine, database_url, registry, names, rescan_interval=0.1)
    with harness.running(scheduler, supervisor):
        harness.wait_for(lambda: scheduler.stats.dispatched == 1, what="the request is sent")
        time.sleep(2)
        with harness.running(harness.agent(agent, names)):
            harness.wait_for(
                lambda: harness.run_states(engine) == {run_id: "completed"},
                timeout=10,
                what="run completes",
            )
    assert len(remaining) == 1
    assert remaining[0] > 2.5, f"the agent got {remaining[0]:.2f} s of its 3 s"
    (step,) = harness.step_rows(engine)
    assert (step.state, step.failure_count, step.attempt, step.wait_expiries) == (
        "processed",
        0,
        1,
        0,
    )


# -- progress at the store, both paths ------------------------------------------------------


@pytest.fixture(params=["batched", "portable"])
def store(request: pytest.FixtureRequest, engine: Engine) -> Engine:
    if request.param == "portable":
        return with_capabilities(engine, capabilities(engine).portable())
    return engine


def _claimed_twice(engine: Engine, names: Names, heartbeat: float | None) -> int:
    """One step claimed, then claimed again (attempt 2), as after a wait expiry."""
    agent = Agent("fenced")
    agent.add_handler("go", lambda _call: None)
    policy = StepPolicy(timeout=60, wait_timeout=30, heartbeat_timeout=heartbeat)
    registry = _one_step(agent, "go", policy)
    _submit(engine, registry, names)
    with transaction(engine) as conn:
        (first,) = claim_steps(conn, locked_by="s", batch=1)
        conn.execute(
            update(steps).where(steps.c.id == first.id).values(state="pending", locked_by=None)
        )
    with transaction(engine) as conn:
        (second,) = claim_steps(conn, locked_by="s", batch=1)
    assert (second.id, second.attempt) == (first.id, 2)
    return second.id


def _row(engine: Engine, step_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(steps, func.now().label("db_now")).where(steps.c.id == step_id)
        ).one()


def _apply(
    engine: Engine, *signals: StepProgress, finished: set[tuple[int, int]] | None = None
) -> Any:
    with transaction(engine) as conn:
        return apply_progress(conn, list(signals), actor="s", finished=finished or set())


def test_progress_of_an_older_attempt_changes_nothing(store: Engine, names: Names) -> None:
    step_id = _claimed_twice(store, names, heartbeat=5)
    before = _row(store, step_id)
    report = _apply(
        store, StepProgress(step_id, 1, started=True), StepProgress(step_id, 1, started=False)
    )
    after = _row(store, step_id)
    assert (report.started, report.heartbeats, report.ignored) == (0, 0, 2)
    assert (after.attempt, after.started_at, after.complete_by) == (
        2,
        None,
        before.complete_by,
    )


def test_started_runs_the_execution_clock_once_and_heartbeats_push_its_heartbeat_clock(
    store: Engine, names: Names
) -> None:
    step_id = _claimed_twice(store, names, heartbeat=5)
    report = _apply(store, StepProgress(step_id, 2, started=True, agent="fenced"))
    first = _row(store, step_id)
    assert report.started == 1
    assert first.started_at is not None
    # The heartbeat clock: started_at + 5 s (the envelope was claim + 90 s).
    assert abs((first.complete_by - first.started_at).total_seconds() - 5) < 0.01
    time.sleep(0.05)
    again = _apply(store, StepProgress(step_id, 2, started=True))
    assert (again.started, again.ignored) == (0, 1)
    assert _row(store, step_id).started_at == first.started_at  # a duplicate extends nothing
    beat = _apply(store, StepProgress(step_id, 2, started=False))
    later = _row(store, step_id)
    assert beat.heartbeats == 1
    assert abs((later.complete_by - later.db_now).total_seconds() - 5) < 0.5
    assert later.complete_by > first.complete_by
    with store.connect() as conn:
        recorded = conn.execute(
            select(events.c.reason, events.c.attempt, events.c.detail).where(
                events.c.step_id == step_id, events.c.reason == "started"
            )
        ).all()
    assert [tuple(r) for r in recorded] == [("started", 2, {"agent": "fenced"})]


def test_a_heartbeat_never_pushes_past_the_execution_clock(store: Engine, names: Names) -> None:
    step_id = _claimed_twice(store, names, heartbeat=5)
    _apply(store, StepProgress(step_id, 2, started=True))
    with store.begin() as conn:  # started 58 s ago: 2 s of its 60 s timeout are left
        conn.execute(
            update(steps)
            .where(steps.c.id == step_id)
            .values(started_at=func.now() - func.make_interval(0, 0, 0, 0, 0, 0, 58))
        )
    _apply(store, StepProgress(step_id, 2, started=False))
    row = _row(store, step_id)
    assert abs((row.complete_by - row.started_at).total_seconds() - 60) < 0.01


def test_heartbeats_of_a_step_without_a_heartbeat_clock_are_accepted_and_change_nothing(
    store: Engine, names: Names
) -> None:
    step_id = _claimed_twice(store, names, heartbeat=None)
    _apply(store, StepProgress(step_id, 2, started=True))
    before = _row(store, step_id)
    assert abs((before.complete_by - before.started_at).total_seconds() - 60) < 0.01
    report = _apply(store, StepProgress(step_id, 2, started=False))
    assert (report.heartbeats, report.ignored) == (0, 1)
    assert _row(store, step_id).complete_by == before.complete_by


def test_a_started_whose_reply_is_in_the_same_batch_is_left_to_the_reply(
    store: Engine, names: Names
) -> None:
    step_id = _claimed_twice(store, names, heartbeat=None)
    report = _apply(store, StepProgress(step_id, 2, started=True), finished={(step_id, 2)})
    assert (report.started, report.ignored) == (0, 1)
    assert _row(store, step_id).started_at is None


def test_the_starts_of_many_steps_apply_together(store: Engine, names: Names) -> None:
    """A batch of starts for several steps takes one statement on PostgreSQL's fast path and
    one per step on the portable path; both record the same rows."""
    agent = Agent("many")
    agent.add_handler("go", lambda _call: None)
    registry = Registry(
        [Workflow("clocked", [Step("only", "many", "go", policy=StepPolicy(timeout=7))])], [agent]
    )
    with store.begin() as conn:
        for i in range(5):
            submit_run(conn, registry, "clocked", {}, key=f"k{i}", namespace=names.namespace)
    with transaction(store) as conn:
        claimed = claim_steps(conn, locked_by="s", batch=10)
    report = _apply(store, *(StepProgress(c.id, c.attempt, started=True) for c in claimed))
    assert report.started == 5
    for c in claimed:
        row = _row(store, c.id)
        assert abs((row.complete_by - row.started_at).total_seconds() - 7) < 0.01
        assert row.wait_expiries == 0
