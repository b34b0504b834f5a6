"""The supervisor at work as operators run it: recovery from a killed agent, `--once`."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from sqlalchemy import Engine

from sasflow import submit_run
from sasflow.transport.topology import Names
from tests import harness
from tests.acceptance.processes import Processes
from tests.apps import ops

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]


def _calls(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_agent_killed_mid_step_is_recovered_by_the_supervisor_and_another_agent(
    engine: Engine, names: Names, procs: Processes, tmp_path: Path
) -> None:
    """SIGKILL the agent while it works: the step expires, the supervisor makes it pending,
    a second agent completes it, and the remote service saw the same idempotency key twice."""
    remote_log = tmp_path / "remote.jsonl"
    procs.env["SASFLOW_APP"] = "tests.apps.ops"
    procs.env["SASFLOW_TEST_REMOTE_LOG"] = str(remote_log)
    procs.start("scheduler", "scheduler", "--rescan-interval", "0.2")
    procs.start("supervisor", "supervisor", "--interval", "0.3")
    first = procs.start("agent-1", "agent", "remote")
    # The request's TTL is its wait timeout (2 s): the agent must consume before it is sent.
    procs.wait_ready("scheduler", "agent-1")
    with engine.begin() as conn:
        run = submit_run(
            conn, ops.registry, "killable", {"delay": 2}, key="k", namespace=names.namespace
        )
    harness.wait_for(lambda: len(_calls(remote_log)) == 1, what="the first agent starts")
    # Killed once it said `started` (docs/timeouts.md): its silence is then an execution
    # timeout, charged, and not mistaken for the wait of an absent agent.
    harness.wait_for(
        lambda: harness.step_rows(engine, run.run_id)[0].started_at is not None,
        what="the scheduler applies the agent's started",
    )
    procs.signal("agent-1", signal.SIGKILL)
    assert procs.wait("agent-1") == -signal.SIGKILL
    # The broker requeues the killed agent's request; it expires unconsumed (its TTL is the
    # wait timeout, 2 s) while the supervisor finds the step past its execution deadline (the
    # agent said it started it) and makes it pending, one failure counted.
    harness.wait_for(
        lambda: harness.step_rows(engine, run.run_id)[0].failure_count == 1,
        timeout=30,
        what="the supervisor reclaims the expired step",
    )
    procs.start("agent-2", "agent", "remote")
    harness.wait_for(
        lambda: harness.run_states(engine) == {run.run_id: "completed"},
        timeout=60,
        what="the run completes on the second agent",
    )
    calls = _calls(remote_log)
    assert len(calls) == 2
    assert calls[0]["key"] == calls[1]["key"], "the retry used another idempotency key"
    assert (calls[0]["attempt"], calls[1]["attempt"]) == (1, 2)
    assert calls[0]["pid"] == first.pid
    assert calls[1]["pid"] != first.pid
    (step,) = harness.step_rows(engine, run.run_id)
    assert (step.state, step.failure_count, step.attempt) == ("processed", 1, 2)
    procs.assert_alive_except("agent-1")


def test_once_exits_0_when_it_ran_and_1_when_the_database_is_unreachable(
    procs: Processes,
) -> None:
    ran = procs.run("supervisor", "--once")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("swept: reclaimed=0 escalated=0 compensations=0 alerts=0")
    assert " waited=0 " in ran.stdout
    procs.env["SASFLOW_DATABASE_URL"] = "postgresql+psycopg://nobody@127.0.0.1:1/none"
    down = procs.run("supervisor", "--once")
    assert down.returncode == 1
    assert "could not run" in down.stderr
