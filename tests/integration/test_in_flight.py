"""A scheduler keeps at most `max_in_flight` (+ its claim batch - 1) steps of one agent in
flight; the rest stay pending, deadlines not started, and a slow agent at its bound does not
hold back the steps of another agent."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine, text

from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration

BOUND = 5
BATCH = 2
SLOW_RUNS = 20


def _registry(gate: threading.Event) -> tuple[Registry, Agent, Agent]:
    slow, quick = Agent("slow"), Agent("quick")

    @slow.handler("wait")
    def wait(call: Call) -> None:
        gate.wait(call.remaining())

    @quick.handler("go")
    def go(_call: Call) -> None:
        return None

    policy = StepPolicy(timeout=60)
    registry = Registry(
        [
            Workflow("slow", [Step("only", "slow", "wait", policy=policy)]),
            Workflow("quick", [Step("only", "quick", "go", policy=policy)]),
        ],
        [slow, quick],
    )
    return registry, slow, quick


def _in_state(engine: Engine, agent: str, state: str) -> int:
    """Steps of `agent` in `state`."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM steps WHERE agent = :a AND state = :s"),
                {"a": agent, "s": state},
            ).scalar_one()
        )


def _completed(engine: Engine, workflow: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM runs WHERE workflow = :w AND state = 'completed'"),
                {"w": workflow},
            ).scalar_one()
        )


def test_an_agent_at_its_bound_is_left_out_of_claims_and_others_are_not(
    engine: Engine, database_url: str, names: Names
) -> None:
    gate = threading.Event()
    registry, slow, quick = _registry(gate)
    with engine.begin() as conn:
        for i in range(SLOW_RUNS):
            submit_run(conn, registry, "slow", {}, key=f"s{i}", namespace=names.namespace)
    scheduler = harness.scheduler(
        engine, database_url, registry, names, claim_batch=BATCH, max_in_flight=BOUND
    )
    with harness.running(
        scheduler, harness.agent(slow, names, concurrency=1), harness.agent(quick, names)
    ):
        try:
            _check_the_bound(engine, registry, names)
        finally:
            gate.set()  # the slow handlers return, so the roles can stop
        harness.wait_for(
            lambda: _completed(engine, "slow") == SLOW_RUNS,
            timeout=30,
            what="every slow step dispatched as room frees up",
        )


def _check_the_bound(engine: Engine, registry: Registry, names: Names) -> None:
    harness.wait_for(
        lambda: _in_state(engine, "slow", "processing") >= BOUND,
        what="the slow agent's steps dispatched up to the bound",
    )
    # Work for the other agent arrives while the slow one is at its bound.
    with engine.begin() as conn:
        for i in range(5):
            submit_run(conn, registry, "quick", {}, key=f"q{i}", namespace=names.namespace)
    harness.wait_for(
        lambda: _completed(engine, "quick") == 5,
        timeout=15,
        what="the quick agent's steps claimed past the slow agent's bound",
    )
    held = [_in_state(engine, "slow", "processing") for _ in range(20)]
    assert BOUND <= max(held) <= BOUND + BATCH - 1, held
    assert _in_state(engine, "slow", "pending") >= SLOW_RUNS - (BOUND + BATCH - 1)
