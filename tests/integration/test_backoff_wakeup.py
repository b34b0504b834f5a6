"""A retry is claimed when its backoff ends, not at the scheduler's next rescan.

The schedulers here rescan only every 30 s: each retry below must run within a few seconds of
its backoff's end, which only the wake-up at the end of the backoff can explain."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine

from sasflow import Backoff, Registry, RetryPolicy, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call, TransientError
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration

RESCAN = 30.0
BACKOFF = 0.5


def _flaky_registry(fail: str) -> tuple[Registry, Agent, list[tuple[int, float]]]:
    """One step whose first attempt fails (`fail`: "transient" replies `failed`, "hang" stays
    silent past the deadline) and whose second succeeds; records (attempt, start time)."""
    agent = Agent("flaky", retry=RetryPolicy(initial=0.05, max_attempts=1))
    calls: list[tuple[int, float]] = []

    @agent.handler("work")
    def work(call: Call) -> dict[str, int]:
        calls.append((call.attempt, time.monotonic()))
        if call.attempt == 1 and fail == "transient":
            raise TransientError("the remote service is busy")
        if call.attempt == 1:
            time.sleep(call.remaining() + 0.2)
        return {"attempt": call.attempt}

    @agent.handler("fast")
    def fast(call: Call) -> None:
        return None

    policy = StepPolicy(timeout=1.0, max_failures=3, backoff=Backoff(initial=BACKOFF))
    return (
        Registry(
            [
                Workflow("flaky", [Step("only", "flaky", "work", policy=policy)]),
                Workflow("quick", [Step("only", "flaky", "fast")]),
            ],
            [agent],
        ),
        agent,
        calls,
    )


def _gap_between_attempts(
    engine: Engine, database_url: str, names: Names, fail: str, *others: harness.Role
) -> float:
    """Run one `flaky` run to completion with a scheduler that rescans every 30 s (and the
    `others`); the seconds between its two attempts' starts."""
    registry, agent, calls = _flaky_registry(fail)
    with engine.begin() as conn:
        run = submit_run(conn, registry, "flaky", {}, key="k", namespace=names.namespace)
    with harness.running(
        harness.scheduler(engine, database_url, registry, names, rescan_interval=RESCAN),
        harness.agent(agent, names),
        *others,
    ):
        harness.wait_for(
            lambda: harness.run_states(engine) == {run.run_id: "completed"},
            timeout=10,
            what="the retry runs when its backoff ends",
        )
    assert [attempt for attempt, _ in calls] == [1, 2]
    return calls[1][1] - calls[0][1]


def test_a_failed_reply_is_retried_when_its_backoff_ends(
    engine: Engine,
    database_url: str,
    names: Names,
) -> None:
    gap = _gap_between_attempts(engine, database_url, names, "transient")
    assert BACKOFF <= gap < BACKOFF + 3, gap


def test_a_step_reclaimed_by_the_supervisor_is_retried_when_its_backoff_ends(
    engine: Engine,
    database_url: str,
    names: Names,
) -> None:
    supervisor = Supervisor(
        engine,
        names,
        transport=harness.transport("supervisor"),
        options=SupervisorOptions(interval=0.1),
    )
    try:
        gap = _gap_between_attempts(engine, database_url, names, "hang", supervisor)
    finally:
        supervisor.close()
    assert 1.0 + BACKOFF <= gap < 1.0 + BACKOFF + 3, gap  # deadline, sweep, backoff


def test_claiming_other_work_meanwhile_keeps_the_retry_on_time(
    engine: Engine,
    database_url: str,
    names: Names,
) -> None:
    """A claim that takes some ready steps (not a full batch) still learns when the backoff
    of another step ends."""
    registry, agent, calls = _flaky_registry("transient")
    with engine.begin() as conn:
        run = submit_run(conn, registry, "flaky", {}, key="k", namespace=names.namespace)
    with harness.running(
        harness.scheduler(engine, database_url, registry, names, rescan_interval=RESCAN),
        harness.agent(agent, names),
    ):
        harness.wait_for(
            lambda: harness.step_rows(engine, run.run_id)[0].failure_count == 1,
            timeout=10,
            what="the first attempt's failure is counted",
        )
        with engine.begin() as conn:
            other = submit_run(conn, registry, "quick", {}, key="q", namespace=names.namespace)
        harness.wait_for(
            lambda: (
                harness.run_states(engine) == {run.run_id: "completed", other.run_id: "completed"}
            ),
            timeout=10,
            what="both runs complete, the retry on time",
        )
    assert [attempt for attempt, _ in calls] == [1, 2]
    assert BACKOFF <= calls[1][1] - calls[0][1] < BACKOFF + 3
