"""A rolling deploy on the real broker and database: two processes of one agent consume its
queue, the older one without the action `fresh`. It hands those requests back for the newer
one instead of failing their steps (sasflow.agents.handback, docs/agents.md)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow.store.schema import alerts
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import fleet

pytestmark = pytest.mark.integration

RUNS = 12


def test_an_older_process_hands_an_action_it_lacks_to_one_that_has_it(
    engine: Engine, database_url: str, names: Names
) -> None:
    old = harness.agent(fleet.old, names, concurrency=2)
    new = harness.agent(fleet.new, names, concurrency=2)
    scheduler = harness.scheduler(engine, database_url, fleet.registry, names, rescan_interval=0.2)
    with harness.running(old, new):
        harness.wait_for(lambda: harness.consumers(names.agent("mixed")) == 2, what="consumers")
        run_ids = [
            harness.submit(engine, fleet.registry, names, "fresh", key=f"r{i}", run_input=i)
            for i in range(RUNS)
        ]
        with harness.running(scheduler):
            harness.wait_for(
                harness.all_runs_in(engine, {"completed", "error"}, RUNS),
                what="every run finishes",
            )
    assert harness.run_states(engine) == dict.fromkeys(run_ids, "completed")
    assert [s.failure_count for s in harness.step_rows(engine)] == [0] * RUNS
    assert old.stats.handed_back > 0, "the older process never got a request for `fresh`"
    assert (old.stats.replied_error, old.stats.replied_ok) == (0, 0)
    assert new.stats.replied_ok == RUNS


def test_with_no_process_that_has_the_action_the_step_is_deferred_and_an_alert_says_why(
    engine: Engine, database_url: str, names: Names
) -> None:
    """Requeued a few times, then deferred with a growing delay and the reason: the step
    stays pending, uncharged; once deferred for `outage_after` with no live instance reporting
    the action, the supervisor raises one `action_missing` alert; a process with the action
    runs it."""
    old = harness.agent(fleet.old, names, concurrency=2)
    scheduler = harness.scheduler(
        engine, database_url, fleet.registry, names, rescan_interval=0.2, fleet_interval=0.1
    )
    supervisor = Supervisor(
        engine, names, options=SupervisorOptions(interval=0.1, outage_after=0.5)
    )
    run_id = harness.submit(engine, fleet.registry, names, "fresh", key="alone", run_input=1)
    with harness.running(old, scheduler):
        harness.wait_for(lambda: old.stats.deferred >= 2, what="two deferrals")
        (step,) = harness.step_rows(engine, run_id)
        assert (step.state, step.failure_count) in {("pending", 0), ("processing", 0)}
        assert step.error["type"] == "ActionNotHere"
        assert "has no action 'fresh' (it has: plain)" in step.error["message"]
        assert old.stats.handed_back >= 3
        harness.wait_for(lambda: bool(_missing(engine, supervisor)), timeout=15, what="the alert")
        ((key, message, detail),) = _missing(engine, supervisor)
        assert key == "action_missing:mixed/fresh"
        assert message.startswith(
            f"no instance of agent 'mixed' has action 'fresh' (instances: {old.id} has plain)"
        )
        assert detail["instances"] == [old.id]
        new = harness.agent(fleet.new, names, concurrency=2)
        with harness.running(new):
            harness.wait_for(
                harness.all_runs_in(engine, {"completed"}, 1), what="the run completes"
            )
    assert harness.step_rows(engine, run_id)[0].failure_count == 0


def _missing(engine: Engine, supervisor: Supervisor) -> list[tuple[str, str, Any]]:
    supervisor.sweep_once()
    with engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                select(alerts.c.dedup_key, alerts.c.message, alerts.c.detail).where(
                    alerts.c.kind == "action_missing"
                )
            )
        ]
