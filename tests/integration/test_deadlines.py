"""Run deadlines on PostgreSQL: set at submission on the database clock (both submission
paths), fired once by the supervisor as an alert, a cancellation or a compensation."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.store.dialect import capabilities, with_capabilities
from sasflow.store.schema import alerts, events, runs
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration


class Trip:
    """Book a (quick) then b (until released); each undone by `undo`."""

    def __init__(
        self, registry: Registry, agent: Agent, calls: list[str], release: threading.Event
    ) -> None:
        self.registry, self.agent, self.calls, self.release = registry, agent, calls, release


def _registry(deadline: float, on_deadline: Any) -> Trip:
    agent = Agent("trip")
    calls: list[str] = []
    release = threading.Event()

    @agent.handler("book")
    def book(call: Call) -> dict[str, str]:
        calls.append(f"book {call.step}")
        if call.step == "b":
            release.wait(call.remaining())
        return {"booked": call.step}

    @agent.handler("undo")
    def undo(call: Call) -> dict[str, str]:
        calls.append(f"undo {call.input['output']['booked']}")
        return {}

    policy = StepPolicy(timeout=20)
    flow = Workflow(
        "late",
        [
            Step("a", "trip", "book", compensate="undo", policy=policy),
            Step("b", "trip", "book", compensate="undo", policy=policy),
        ],
        deadline=deadline,
        on_deadline=on_deadline,
    )
    return Trip(Registry([flow], [agent]), agent, calls, release)


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


def _submit(engine: Engine, registry: Registry, names: Names, key: str = "k") -> int:
    with engine.begin() as conn:
        return submit_run(conn, registry, "late", {}, key=key, namespace=names.namespace).run_id


@pytest.mark.parametrize("path", ["one statement", "portable"])
def test_the_deadline_is_set_at_submission_on_the_database_clock(
    engine: Engine, names: Names, path: str
) -> None:
    store = (
        engine
        if path == "one statement"
        else with_capabilities(engine, capabilities(engine).portable())
    )
    run_id = _submit(store, _registry(90, "cancel").registry, names)
    with engine.connect() as conn:
        row = conn.execute(
            select(runs.c.created_at, runs.c.deadline_at, runs.c.on_deadline).where(
                runs.c.id == run_id
            )
        ).one()
    assert row.on_deadline == "cancel"
    assert (row.deadline_at - row.created_at).total_seconds() == pytest.approx(90, abs=0.01)


def test_a_workflow_without_a_deadline_gives_its_runs_none(engine: Engine, names: Names) -> None:
    agent = Agent("trip")
    agent.add_handler("book", lambda _call: None)
    registry = Registry([Workflow("late", [Step("a", "trip", "book")])], [agent])
    run_id = _submit(engine, registry, names)
    with engine.connect() as conn:
        row = conn.execute(select(runs).where(runs.c.id == run_id)).one()
    assert (row.deadline_at, row.on_deadline, row.deadline_fired_at) == (None, None, None)


def test_a_passed_deadline_raises_one_alert_and_the_run_goes_on(
    engine: Engine, database_url: str, names: Names, supervisor: Supervisor
) -> None:
    trip = _registry(0.5, "alert")
    run_id = _submit(engine, trip.registry, names)
    with harness.running(
        harness.scheduler(engine, database_url, trip.registry, names, rescan_interval=0.1),
        harness.agent(trip.agent, names),
    ):
        time.sleep(0.6)
        first, second = supervisor.sweep_once(), supervisor.sweep_once()
        assert harness.run_states(engine) == {run_id: "running"}
        trip.release.set()
        harness.wait_for(lambda: harness.run_states(engine) == {run_id: "completed"})
    assert first is not None
    assert second is not None
    assert (first.deadlines, len(first.alerts), second.deadlines, second.alerts) == (1, 1, 0, [])
    with engine.connect() as conn:
        (alert,) = conn.execute(select(alerts)).all()
        fired = conn.execute(
            select(runs.c.deadline_at, runs.c.deadline_fired_at).where(runs.c.id == run_id)
        ).one()
        event = conn.execute(select(events).where(events.c.reason == "deadline passed")).one()
    assert (alert.kind, alert.run_id) == ("run_deadline", run_id)
    assert f"run {run_id} of late (key k) has not ended by its deadline" in alert.message
    assert fired.deadline_fired_at > fired.deadline_at
    assert (event.entity, event.from_state, event.to_state) == ("run", "running", "running")
    assert event.detail == {
        "deadline_at": fired.deadline_at.isoformat(),
        "on_deadline": "alert",
    }


def test_a_passed_deadline_cancels_the_run_when_asked(
    engine: Engine, database_url: str, names: Names, supervisor: Supervisor
) -> None:
    trip = _registry(0.5, "cancel")
    run_id = _submit(engine, trip.registry, names)
    try:
        with harness.running(
            harness.scheduler(engine, database_url, trip.registry, names, rescan_interval=0.1),
            harness.agent(trip.agent, names),
            supervisor,
        ):
            harness.wait_for(lambda: harness.run_states(engine) == {run_id: "cancelled"})
            trip.release.set()  # b's handler returns; its late reply is fenced out
    finally:
        trip.release.set()
    steps = {s.name: s for s in harness.step_rows(engine)}
    assert (steps["a"].state, steps["b"].state) == ("processed", "cancelled")
    with engine.connect() as conn:
        error = conn.execute(select(runs.c.error).where(runs.c.id == run_id)).scalar_one()
    assert error["type"] == "Cancelled"
    assert error["message"].startswith("deadline passed (")
    assert error["by"] == supervisor.id
    assert trip.calls == ["book a", "book b"]


def test_a_passed_deadline_compensates_the_run_when_asked(
    engine: Engine, database_url: str, names: Names, supervisor: Supervisor
) -> None:
    """Step b is in flight when the deadline passes: it is left to finish (it may succeed),
    then both bookings are undone in reverse order."""
    trip = _registry(0.5, "compensate")
    run_id = _submit(engine, trip.registry, names)
    with harness.running(
        harness.scheduler(engine, database_url, trip.registry, names, rescan_interval=0.1),
        harness.agent(trip.agent, names),
        supervisor,
    ):
        harness.wait_for(lambda: harness.run_states(engine) == {run_id: "compensating"})
        trip.release.set()
        harness.wait_for(lambda: harness.run_states(engine) == {run_id: "compensated"})
    assert trip.calls == ["book a", "book b", "undo b", "undo a"]


def test_a_run_that_ends_before_its_deadline_is_left_alone(
    engine: Engine, database_url: str, names: Names, supervisor: Supervisor
) -> None:
    trip = _registry(1.0, "cancel")
    trip.release.set()
    run_id = _submit(engine, trip.registry, names)
    with harness.running(
        harness.scheduler(engine, database_url, trip.registry, names, rescan_interval=0.1),
        harness.agent(trip.agent, names),
    ):
        harness.wait_for(lambda: harness.run_states(engine) == {run_id: "completed"})
    time.sleep(1.1)
    report = supervisor.sweep_once()
    assert report is not None
    assert report.deadlines == 0
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(alerts)).scalar_one() == 0
