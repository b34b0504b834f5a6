"""Wedged agents on the real broker and database (the issue's scenario): two handlers that
ignore `call.cancelled` hold both threads of an agent process past their deadline. It stops
taking requests and hands back the one it could not start, so a trivial step completes on the
other process; `agents list` shows it wedged, the supervisor raises `agent_wedged`, it takes
requests again once a thread is free, and past its bound it stops with WEDGED_EXIT_CODE
(sasflow.agents.wedge, docs/agents.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, select

from sasflow.agents.wedge import WEDGED_EXIT_CODE, WedgeOptions
from sasflow.agents.worker import AgentOptions, AgentWorker
from sasflow.cli.main import cli
from sasflow.store.schema import alerts
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import fleet

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _release() -> Iterator[None]:
    fleet.release.clear()
    yield
    fleet.release.set()  # the hung handlers return, their threads end


def _stuck(names: Names, *, grace: float, exit_after: float) -> AgentWorker:
    return AgentWorker(
        fleet.stuck,
        harness.transport("stuck"),
        names,
        concurrency=2,
        options=AgentOptions(
            heartbeat_interval=0.2, wedge=WedgeOptions(grace=grace, exit_after=exit_after)
        ),
    )


def _listed(database_url: str, names: Names) -> list[dict[str, Any]]:
    listed = CliRunner().invoke(
        cli,
        ["agents", "list", "-o", "json"],
        env={"SASFLOW_DATABASE_URL": database_url, "SASFLOW_NAMESPACE": names.namespace},
    )
    assert listed.exit_code == 0, listed.output
    found: list[dict[str, Any]] = json.loads(listed.output)
    return found


def _hang_both_threads(engine: Engine, names: Names, stuck: AgentWorker) -> None:
    for i in range(2):
        harness.submit(engine, fleet.registry, names, "hang", key=f"hang-{i}", run_input=i)
    harness.wait_for(lambda: stuck.stats.abandoned == 2, what="both hung steps abandoned")


def test_a_wedged_agent_hands_its_work_to_another_and_says_so(
    engine: Engine, database_url: str, names: Names
) -> None:
    stuck = _stuck(names, grace=5.0, exit_after=0)
    healthy = harness.agent(fleet.healthy, names, concurrency=2)
    queue = names.agent("stuck")
    scheduler = harness.scheduler(
        engine, database_url, fleet.registry, names, rescan_interval=0.2, fleet_interval=0.1
    )
    with harness.running(scheduler, stuck):
        _hang_both_threads(engine, names, stuck)
        # Taken while the threads are not yet counted held: it waits in the process.
        quick = harness.submit(engine, fleet.registry, names, "quick", key="quick", run_input=1)
        harness.wait_for(lambda: stuck.stats.received == 3, what="the quick request taken")
        harness.wait_for(lambda: harness.consumers(queue) == 0, what="the wedged one stops")
        harness.wait_for(lambda: stuck.stats.handed_back == 1, what="the quick one handed back")
        harness.wait_for(
            lambda: (
                [i["status"] for i in _listed(database_url, names)]
                == ["wedged, 2 held past deadline"]
            ),
            what="agents list showing it wedged",
        )
        (shown,) = _listed(database_url, names)
        assert (shown["state"], shown["wedged"], shown["held"]) == ("live", True, 2)
        supervisor = Supervisor(engine, names, options=SupervisorOptions(interval=0.1))
        supervisor.sweep_once()
        supervisor.sweep_once()  # raises nothing more: one alert per instance while open
        with harness.running(healthy):
            harness.wait_for(
                lambda: harness.run_states(engine).get(quick) == "completed",
                timeout=10,
                what="the quick run completes on the other process",
            )
        assert healthy.stats.replied_ok == 1
        fleet.release.set()  # the handlers return: a thread is free, it takes requests again
        harness.wait_for(lambda: harness.consumers(queue) == 1, what="it consumes again")
        harness.wait_for(
            lambda: [i["status"] for i in _listed(database_url, names)] == ["live"],
            what="agents list showing it live",
        )
    with engine.connect() as conn:
        raised = conn.execute(
            select(alerts.c.kind, alerts.c.dedup_key, alerts.c.detail).where(
                alerts.c.kind == "agent_wedged"
            )
        ).all()
    ((kind, key, detail),) = raised
    assert (kind, key) == ("agent_wedged", f"agent_wedged:{stuck.id}")
    assert (detail["held"], detail["concurrency"]) == (2, 2)
    assert stuck.exit_code == 0


def test_an_agent_wedged_past_its_bound_stops_with_the_exit_code(
    engine: Engine, database_url: str, names: Names
) -> None:
    stuck = _stuck(names, grace=0.2, exit_after=0.5)
    scheduler = harness.scheduler(engine, database_url, fleet.registry, names, rescan_interval=0.2)
    with harness.running(scheduler, stuck):
        _hang_both_threads(engine, names, stuck)
        harness.wait_for(stuck.stop_event.is_set, what="the wedged agent stopping")
    assert stuck.exit_code == WEDGED_EXIT_CODE
