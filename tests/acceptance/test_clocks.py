"""The heartbeat clock as operators run it: an agent process killed in the middle of a long,
heartbeating step is found within seconds, not at its hour-long (here 60 s) timeout."""

from __future__ import annotations

import json
import signal
import time
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


def test_an_agent_killed_under_a_heartbeat_clock_is_found_within_seconds(
    engine: Engine, names: Names, procs: Processes, tmp_path: Path
) -> None:
    """Timeout 60 s, heartbeat timeout 1 s: SIGKILL the agent while its handler heartbeats;
    the supervisor charges one failure (`HeartbeatTimeout`) within a few seconds, and a second
    agent completes the step."""
    remote_log = tmp_path / "remote.jsonl"
    procs.env["SASFLOW_APP"] = "tests.apps.ops"
    procs.env["SASFLOW_TEST_REMOTE_LOG"] = str(remote_log)
    procs.start("scheduler", "scheduler", "--rescan-interval", "0.2")
    procs.start("supervisor", "supervisor", "--interval", "0.2")
    first = procs.start("agent-1", "agent", "remote")
    with engine.begin() as conn:
        run = submit_run(
            conn, ops.registry, "heartbeating", {"delay": 3}, key="k", namespace=names.namespace
        )
    harness.wait_for(
        lambda: harness.step_rows(engine, run.run_id)[0].started_at is not None,
        timeout=30,
        what="the first agent starts the step",
    )
    time.sleep(1.5)  # it heartbeats past its heartbeat timeout
    assert harness.step_rows(engine, run.run_id)[0].failure_count == 0
    procs.signal("agent-1", signal.SIGKILL)
    killed = time.monotonic()
    assert procs.wait("agent-1") == -signal.SIGKILL
    harness.wait_for(
        lambda: harness.step_rows(engine, run.run_id)[0].failure_count == 1,
        timeout=20,
        what="the supervisor finds the dead agent",
    )
    found_after = time.monotonic() - killed
    (step,) = harness.step_rows(engine, run.run_id)
    assert step.error == {
        "type": "HeartbeatTimeout",
        "message": "heartbeat clock: no heartbeat for 1 s",
    }
    assert found_after < 5, f"found {found_after:.1f} s after the kill"
    procs.start("agent-2", "agent", "remote")
    harness.wait_for(
        lambda: harness.run_states(engine) == {run.run_id: "completed"},
        timeout=30,
        what="the run completes on the second agent",
    )
    (done,) = harness.step_rows(engine, run.run_id)
    assert (done.state, done.failure_count) == ("processed", 1)
    calls = _calls(remote_log)
    assert calls[0]["pid"] == first.pid
    assert {c["key"] for c in calls} == {calls[0]["key"]}, "a retry used another key"
    procs.assert_alive_except("agent-1")
