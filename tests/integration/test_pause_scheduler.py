"""Pausing with a real scheduler and agent over RabbitMQ: a paused run's step in flight
finishes and its reply is applied, but its next step is not dispatched while another run's is;
resume completes it. A paused agent's steps wait with no attempt started; resume dispatches
them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.ops import pause
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration

QUIET = 1.0
"""Seconds a scheduler is given to (wrongly) dispatch a held step: several claim passes."""


def _app(gate: threading.Event) -> tuple[Registry, Agent]:
    busy = Agent("busy")

    @busy.handler("first")
    def first(call: Call) -> None:
        gate.wait(call.remaining())

    @busy.handler("second")
    def second(call: Call) -> None:
        return None

    policy = StepPolicy(timeout=60)
    steps = [
        Step("first", "busy", "first", policy=policy),
        Step("second", "busy", "second", policy=policy, after=("first",)),
    ]
    return Registry([Workflow("two", steps)], [busy]), busy


def _submit(engine: Engine, registry: Registry, names: Names, count: int) -> list[int]:
    with engine.begin() as conn:
        return [
            submit_run(conn, registry, "two", {}, key=f"k{i}", namespace=names.namespace).run_id
            for i in range(count)
        ]


def _rows(engine: Engine, sql: str, **params: object) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    opened = threading.Event()
    yield opened
    opened.set()


def test_a_paused_runs_next_step_waits_while_another_runs_goes_and_resume_completes_it(
    engine: Engine, database_url: str, names: Names, gate: threading.Event
) -> None:
    registry, busy = _app(gate)
    held, other = _submit(engine, registry, names, 2)
    scheduler = harness.scheduler(engine, database_url, registry, names)
    with harness.running(scheduler, harness.agent(busy, names, concurrency=4)):
        harness.wait_for(
            lambda: (
                _rows(engine, "SELECT count(*) FROM steps WHERE state = 'processing'") == [(2,)]
            ),
            what="both first steps in flight",
        )
        with engine.begin() as conn:
            pause.pause_run(conn, held, actor="ann", reason="hold it")
        gate.set()
        harness.wait_for(
            lambda: (
                _rows(engine, "SELECT state FROM runs WHERE id = :id", id=other) == [("completed",)]
            ),
            what="the other run completed",
        )
        harness.wait_for(
            lambda: (
                _rows(
                    engine, "SELECT state FROM steps WHERE run_id = :id AND name = 'first'", id=held
                )
                == [("processed",)]
            ),
            what="the paused run's step in flight finished",
        )
        time.sleep(QUIET)  # show that nothing happens: claims pass, the step stays
        assert _rows(
            engine,
            "SELECT state, attempt, dispatched_at FROM steps "
            "WHERE run_id = :id AND name = 'second'",
            id=held,
        ) == [("pending", 0, None)]
        with engine.begin() as conn:
            pause.resume_run(conn, held, actor="bob", reason="go on")
            pause.wake(conn, names.namespace)
        harness.wait_for(
            lambda: (
                _rows(engine, "SELECT state FROM runs WHERE id = :id", id=held) == [("completed",)]
            ),
            what="the resumed run completed",
        )


def test_a_paused_agents_steps_wait_unstarted_and_resume_dispatches_them(
    engine: Engine, database_url: str, names: Names, gate: threading.Event
) -> None:
    gate.set()
    registry, busy = _app(gate)
    scheduler = harness.scheduler(engine, database_url, registry, names)
    with harness.running(scheduler, harness.agent(busy, names)):
        with engine.begin() as conn:
            pause.pause_agent(
                conn, "busy", actor="ann", reason="upgrade", namespace=names.namespace
            )
        run_ids = _submit(engine, registry, names, 2)
        time.sleep(QUIET)  # show that nothing happens
        assert (
            _rows(
                engine,
                "SELECT name, state, attempt, dispatched_at, complete_by FROM steps "
                "WHERE name = 'first' OR attempt > 0 ORDER BY run_id",
            )
            == [("first", "pending", 0, None, None)] * 2
        )
        with engine.begin() as conn:
            pause.resume_agent(conn, "busy", actor="ann", reason="done", namespace=names.namespace)
        harness.wait_for(
            lambda: (
                _rows(engine, "SELECT count(*) FROM runs WHERE state = 'completed'")
                == [(len(run_ids),)]
            ),
            timeout=10,
            what="the runs completed once the agent is resumed",
        )
