"""Timer steps (`Step.sleep`) and runs submitted to start later (`start_at`), through real
schedulers on PostgreSQL and RabbitMQ: no agent runs a timer, it is processed when its time
comes on the database clock, and one due while no scheduler and no supervisor runs fires once
after they are back.

The schedulers here rescan only every 30 s: a timer that fires within a few seconds of its time
was woken by the timer duty's own due time, not by a rescan."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update

from sasflow import Registry, Step, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.store.db import transaction
from sasflow.store.runs import timers
from sasflow.store.runs.claim import claim_steps
from sasflow.store.schema import events, steps
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from sasflow.workflow import StepContext
from tests import harness

pytestmark = pytest.mark.integration

RESCAN = 30.0
SLEEP = 2.0


def _until(ctx: StepContext) -> datetime:
    return datetime.fromisoformat(ctx.run_input["wake_at"])


def _registry() -> tuple[Registry, Agent]:
    agent = Agent("work")

    @agent.handler("do")
    def do(call: Call) -> dict[str, Any]:
        return {"step": call.step}

    registry = Registry(
        [
            Workflow(
                "nap",
                [
                    Step("a", "work", "do"),
                    Step.sleep("wait", seconds=SLEEP),
                    Step("b", "work", "do"),
                ],
            ),
            Workflow(
                "alarm",
                [
                    Step("a", "work", "do"),
                    Step.sleep("wait", until=_until),
                    Step("b", "work", "do"),
                ],
            ),
            Workflow("later", [Step("a", "work", "do")]),
        ],
        [agent],
    )
    return registry, agent


def _event_time(engine: Engine, run_id: int, step: str, to_state: str) -> datetime:
    """When (database clock) the first event of `step` reaching `to_state` was recorded."""
    with engine.connect() as conn:
        found = conn.execute(
            select(func.min(events.c.created_at)).where(
                events.c.run_id == run_id, events.c.step == step, events.c.to_state == to_state
            )
        ).scalar_one()
    assert isinstance(found, datetime), (run_id, step, to_state)
    return found


def _db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        now: datetime = conn.execute(select(func.now())).scalar_one()
    return now


def _completed(engine: Engine, *run_ids: int) -> bool:
    return harness.run_states(engine) == dict.fromkeys(run_ids, "completed")


def test_a_sleep_step_holds_its_successor_for_its_duration_without_an_agent(
    engine: Engine, database_url: str, names: Names
) -> None:
    registry, agent = _registry()
    with engine.begin() as conn:
        run = submit_run(conn, registry, "nap", {}, key="k", namespace=names.namespace)
    with harness.running(
        harness.scheduler(engine, database_url, registry, names, rescan_interval=RESCAN),
        harness.agent(agent, names),
    ):
        harness.wait_for(lambda: _completed(engine, run.run_id), timeout=15, what="the run ends")
    a_done = _event_time(engine, run.run_id, "a", "processed")
    b_claimed = _event_time(engine, run.run_id, "b", "processing")
    slept = (b_claimed - a_done).total_seconds()
    assert SLEEP <= slept < SLEEP + 3, slept
    wait = next(r for r in harness.step_rows(engine, run.run_id) if r.name == "wait")
    assert wait.state == "processed"
    assert wait.attempt == 0  # never dispatched to an agent
    assert datetime.fromisoformat(wait.output["slept_until"]) == a_done + timedelta(seconds=SLEEP)


def test_a_timer_until_a_time_from_the_run_input_fires_at_that_time(
    engine: Engine, database_url: str, names: Names
) -> None:
    registry, agent = _registry()
    wake_at = _db_now(engine) + timedelta(seconds=SLEEP)
    with engine.begin() as conn:
        run = submit_run(
            conn,
            registry,
            "alarm",
            {"wake_at": wake_at.isoformat()},
            key="k",
            namespace=names.namespace,
        )
    with harness.running(
        harness.scheduler(engine, database_url, registry, names, rescan_interval=RESCAN),
        harness.agent(agent, names),
    ):
        harness.wait_for(lambda: _completed(engine, run.run_id), timeout=15, what="the run ends")
    fired = _event_time(engine, run.run_id, "wait", "processed")
    assert wake_at <= fired < wake_at + timedelta(seconds=3), (wake_at, fired)
    wait = next(r for r in harness.step_rows(engine, run.run_id) if r.name == "wait")
    assert wait.output == {"slept_until": wake_at.isoformat()}


def test_a_sleeping_timer_survives_a_scheduler_restart(
    engine: Engine, database_url: str, names: Names
) -> None:
    """The first scheduler stops while the timer sleeps; the timer falls due while no scheduler
    and no supervisor runs; a second scheduler, started beside a supervisor after the timer's
    time has passed, fires it once."""
    registry, agent = _registry()
    with engine.begin() as conn:
        run = submit_run(conn, registry, "nap", {}, key="k", namespace=names.namespace)

    def sleeping() -> bool:
        return any(
            r.name == "wait" and r.state == "pending" for r in harness.step_rows(engine, run.run_id)
        )

    with harness.running(
        harness.scheduler(engine, database_url, registry, names, rescan_interval=RESCAN),
        harness.agent(agent, names),
    ):
        harness.wait_for(sleeping, timeout=10, what="the timer sleeps")
    assert harness.run_states(engine) == {run.run_id: "running"}
    due = _event_time(engine, run.run_id, "a", "processed") + timedelta(seconds=SLEEP)
    harness.wait_for(lambda: _db_now(engine) > due, timeout=10, what="the timer falls due")
    with harness.running(
        harness.scheduler(engine, database_url, registry, names, rescan_interval=RESCAN),
        harness.agent(agent, names),
        Supervisor(engine, names, options=SupervisorOptions(interval=0.1)),
    ):
        harness.wait_for(lambda: _completed(engine, run.run_id), timeout=15, what="the run ends")
    with engine.connect() as conn:
        fired = conn.execute(
            select(func.count()).where(
                events.c.run_id == run.run_id,
                events.c.step == "wait",
                events.c.to_state == "processed",
            )
        ).scalar_one()
    assert fired == 1, fired
    slept = (
        _event_time(engine, run.run_id, "b", "processing")
        - _event_time(engine, run.run_id, "a", "processed")
    ).total_seconds()
    assert slept >= SLEEP


def test_a_run_submitted_with_start_at_is_not_claimed_before_it(
    engine: Engine, database_url: str, names: Names
) -> None:
    registry, agent = _registry()
    start_at = _db_now(engine) + timedelta(seconds=SLEEP)
    with engine.begin() as conn:
        later = submit_run(
            conn, registry, "later", {}, key="l", namespace=names.namespace, start_at=start_at
        )
        past = submit_run(
            conn,
            registry,
            "later",
            {},
            key="p",
            namespace=names.namespace,
            start_at=start_at - timedelta(days=1),
        )
    with harness.running(
        harness.scheduler(engine, database_url, registry, names, rescan_interval=RESCAN),
        harness.agent(agent, names),
    ):
        harness.wait_for(
            lambda: _completed(engine, later.run_id, past.run_id), timeout=15, what="both end"
        )
    claimed = _event_time(engine, later.run_id, "a", "processing")
    assert start_at <= claimed < start_at + timedelta(seconds=3), (start_at, claimed)
    assert _event_time(engine, past.run_id, "a", "processing") < start_at  # a past time: at once


def test_a_due_timer_is_never_claimed_for_an_agent_and_fires_once(engine: Engine) -> None:
    """The claim leaves timer steps alone, due or not; `fire_due` marks a due one processed and
    makes its successor ready; a second pass finds nothing to fire."""
    registry, _ = _registry()
    with engine.begin() as conn:
        run = submit_run(conn, registry, "nap", {}, key="k", namespace="t").run_id
        ids = {r.name: r.id for r in conn.execute(select(steps).where(steps.c.run_id == run))}
        conn.execute(update(steps).where(steps.c.id == ids["a"]).values(state="processed"))
        conn.execute(
            update(steps)
            .where(steps.c.id == ids["wait"])
            .values(state="pending", not_before=func.now() - timedelta(seconds=1))
        )
    with transaction(engine) as conn:
        assert claim_steps(conn, locked_by="s1", batch=10) == []
        fired = timers.fire_due(conn, registry, batch=10, namespace="t", actor="s1")
    assert (fired.fired, fired.ready) == (1, 1)
    by_name = {r.name: r for r in harness.step_rows(engine, run)}
    assert (by_name["wait"].state, by_name["b"].state) == ("processed", "pending")
    assert set(by_name["wait"].output) == {"slept_until"}
    with transaction(engine) as conn:
        assert timers.fire_due(conn, registry, batch=10, namespace="t", actor="s1").fired == 0
        assert [c.name for c in claim_steps(conn, locked_by="s1", batch=10)] == ["b"]
