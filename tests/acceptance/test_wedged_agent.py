"""A real `sasflow agent` process whose every thread a hung handler holds past its deadline
exits, once wedged for `--wedged-exit` seconds, with WEDGED_EXIT_CODE (75) for its service
manager to restart it, without waiting for the hung threads (docs/agents.md)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from sasflow.agents.wedge import WEDGED_EXIT_CODE
from sasflow.transport.topology import Names
from tests import harness
from tests.acceptance.processes import Processes
from tests.apps import fleet

pytestmark = pytest.mark.acceptance


def test_an_agent_wedged_past_its_bound_exits_with_its_status(
    engine: Engine, database_url: str, names: Names, procs: Processes
) -> None:
    procs.env["SASFLOW_APP"] = "tests.apps.fleet"
    procs.start(
        "agent",
        "agent",
        "stuck",
        "--concurrency",
        "2",
        "--wedge-grace",
        "0.2",
        "--wedged-exit",
        "1",
        "--heartbeat-interval",
        "0.5",
    )
    procs.wait_ready("agent")
    scheduler = harness.scheduler(engine, database_url, fleet.registry, names, rescan_interval=0.2)
    with harness.running(scheduler):
        for i in range(2):
            harness.submit(engine, fleet.registry, names, "hang", key=f"h{i}", run_input=i)
        status = procs.wait("agent", timeout=30)
    log = procs.log("agent")
    assert status == WEDGED_EXIT_CODE, log
    assert "wedged: all 2 worker threads are held" in log
    assert "stopping for a restart (exit status 75)" in log
