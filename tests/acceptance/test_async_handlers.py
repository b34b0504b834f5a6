"""`async def` handlers in a real `sasflow agent` process: their runs complete (one deferring
once, with no failure counted), a failure's traceback reaches `sasflow runs show --traceback`,
and SIGTERM stops the agent with exit code 0 and no thread left behind by its event loop."""

from __future__ import annotations

import json
import signal
import uuid

import pytest
from sqlalchemy import Engine

from tests import harness
from tests.acceptance.processes import Processes

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]


def test_an_async_agent_process_runs_defers_fails_with_a_traceback_and_stops_cleanly(
    engine: Engine, procs: Processes
) -> None:
    procs.env["SASFLOW_APP"] = "tests.apps.asyncapp"
    procs.start("scheduler", "scheduler")
    procs.start("agent", "agent", "quotes", "--concurrency", "2")
    procs.wait_ready("scheduler", "agent")
    keys = {}
    for name, run_input in {
        "plain": {"sku": "a"},
        "deferred": {"sku": "b", "defer": True},
        "failed": {"sku": "c", "fail": True},
    }.items():
        keys[name] = uuid.uuid4().hex
        submitted = procs.run(
            "submit", "quote", "--input", json.dumps(run_input), "--key", keys[name]
        )
        assert submitted.returncode == 0, submitted.stderr
    harness.wait_for(harness.all_runs_in(engine, {"completed", "error"}, 3), what="runs end")

    steps = {r.input["sku"]: r for r in harness.step_rows(engine)}
    assert {sku: (s.state, s.failure_count) for sku, s in steps.items()} == {
        "a": ("processed", 0),
        "b": ("processed", 0),
        "c": ("error", 0),
    }
    assert (steps["a"].attempt, steps["b"].attempt) == (1, 2)
    shown = procs.run("runs", "show", str(steps["c"].run_id), "--traceback")
    assert shown.returncode == 0, shown.stderr
    assert "in price" in shown.stdout
    assert "PermanentError: no price for c" in shown.stdout

    procs.signal("agent", signal.SIGTERM)
    assert procs.wait("agent") == 0
    assert "handler threads still running" not in procs.log("agent")
