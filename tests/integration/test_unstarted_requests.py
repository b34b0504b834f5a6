"""Requests an agent process took from the broker but no worker started are handed back at
once when it stops, for another process: not acknowledged unrun and left to the step's wait
clock (sasflow.agents.handback)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from sasflow.agents.wedge import WedgeOptions
from sasflow.agents.worker import AgentOptions, AgentWorker
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import fleet

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _release() -> Iterator[None]:
    fleet.release.clear()
    yield
    fleet.release.set()  # the hung handlers return, their threads end


def test_a_stopping_agent_hands_back_the_requests_no_worker_started(
    engine: Engine, database_url: str, names: Names
) -> None:
    """Its only thread is held by a handler past its deadline, so the next request waits in
    the process; stopping it gives that request to the other process within seconds."""
    stuck = AgentWorker(
        fleet.stuck,
        harness.transport("stuck"),
        names,
        concurrency=1,
        options=AgentOptions(wedge=WedgeOptions(grace=60, exit_after=0)),  # not wedged
    )
    healthy = harness.agent(fleet.healthy, names, concurrency=1)
    scheduler = harness.scheduler(engine, database_url, fleet.registry, names, rescan_interval=0.2)
    with harness.running(scheduler, stuck):
        harness.submit(engine, fleet.registry, names, "hang", key="hang", run_input=0)
        harness.wait_for(lambda: stuck.stats.abandoned == 1, what="the hung step abandoned")
        quick = harness.submit(engine, fleet.registry, names, "quick", key="quick", run_input=1)
        harness.wait_for(lambda: stuck.stats.received == 2, what="the quick request taken")
        with harness.running(healthy):
            harness.wait_for(lambda: harness.consumers(names.agent("stuck")) == 2, what="both")
            stopped = time.monotonic()
            stuck.stop_event.set()
            harness.wait_for(
                lambda: harness.run_states(engine).get(quick) == "completed",
                timeout=5,
                what="the quick run completes on the other process",
            )
            took = time.monotonic() - stopped
    assert stuck.stats.handed_back == 1
    assert healthy.stats.replied_ok == 1
    assert took < 5


def test_a_request_that_never_started_is_not_logged_as_running_past_its_deadline(
    engine: Engine, database_url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    """With its only thread held (not yet long enough to count as wedged), a request waits in
    the process past its envelope: the log says it never started."""
    stuck = AgentWorker(
        fleet.stuck,
        harness.transport("stuck"),
        names,
        concurrency=1,
        options=AgentOptions(wedge=WedgeOptions(grace=60, exit_after=0)),
    )
    scheduler = harness.scheduler(engine, database_url, fleet.registry, names, rescan_interval=0.2)
    with harness.running(scheduler, stuck):
        harness.submit(engine, fleet.registry, names, "hang", key="hang", run_input=0)
        harness.wait_for(lambda: stuck.stats.abandoned == 1, what="the hung step abandoned")
        harness.submit(engine, fleet.registry, names, "brief", key="brief", run_input=1)
        harness.wait_for(lambda: stuck.stats.abandoned == 2, what="the brief step abandoned")
    passed = [r.getMessage() for r in caplog.records if "passed its deadline" in r.getMessage()]
    assert passed == [
        "step 1 attempt 1 passed its deadline while running: no reply",
        (
            "step 2 attempt 1 passed its deadline waiting here for a free worker thread "
            "(never started): no reply"
        ),
    ]
