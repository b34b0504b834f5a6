"""Parking with a real scheduler and agent over RabbitMQ: a partner that keeps failing runs
out its step's failures, the step parks (the run is not failed, a `step_parked` alert is
raised); once the partner is fixed, unparking the run dispatches the step again and the run
completes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from sasflow import Backoff, Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.ops import park
from sasflow.policy import RetryPolicy
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration


def _app(broken: threading.Event) -> tuple[Registry, Agent]:
    partner = Agent("partner", retry=RetryPolicy(initial=0.01, maximum=0.01, max_attempts=1))

    @partner.handler("call")
    def call(call: Call) -> dict[str, Any]:
        if broken.is_set():
            raise ConnectionError("partner down")  # transient: the agent replies `failed`
        return {"called": True}

    policy = StepPolicy(timeout=30, max_failures=2, backoff=Backoff(initial=0.05, maximum=0.05))
    workflow = Workflow(
        "parks", [Step("call", "partner", "call", policy=policy)], on_exhausted="park"
    )
    return Registry([workflow], [partner]), partner


def _rows(engine: Engine, sql: str, **params: object) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


@pytest.fixture
def broken() -> Iterator[threading.Event]:
    flag = threading.Event()
    flag.set()
    yield flag
    flag.clear()


def test_a_step_whose_partner_keeps_failing_parks_and_unparking_completes_the_run(
    engine: Engine, database_url: str, names: Names, broken: threading.Event
) -> None:
    registry, partner = _app(broken)
    with engine.begin() as conn:
        run_id = submit_run(conn, registry, "parks", {}, key="k", namespace=names.namespace).run_id
    scheduler = harness.scheduler(engine, database_url, registry, names, rescan_interval=0.1)
    with harness.running(scheduler, harness.agent(partner, names)):
        harness.wait_for(
            lambda: _rows(engine, "SELECT state, failure_count FROM steps") == [("parked", 2)],
            what="the step parked after its two failures",
        )
        assert harness.run_states(engine) == {run_id: "running"}
        assert _rows(engine, "SELECT kind, acknowledged FROM alerts") == [("step_parked", False)]
        broken.clear()  # the partner is fixed
        with engine.begin() as conn:
            park.unpark_run(
                conn, run_id, actor="ann", reason="partner fixed", namespace=names.namespace
            )
        harness.wait_for(
            lambda: harness.run_states(engine) == {run_id: "completed"},
            what="the unparked run completed",
        )
    assert _rows(engine, "SELECT state, failure_count, attempt FROM steps") == [("processed", 0, 3)]
    # Resolving the alert closed its incident too (a notice `incident_resolved` follows).
    assert _rows(engine, "SELECT kind, acknowledged FROM alerts ORDER BY id") == [
        ("step_parked", True),
        ("incident_resolved", True),
    ]
