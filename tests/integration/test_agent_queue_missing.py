"""An agent's request queue deleted while no agent consumes it (an operator's `delete_queue`,
or a lost node): the scheduler's next request for that agent comes back unroutable
(NO_ROUTE). That is not the step's fault: the scheduler releases the step uncharged, declares
the queue again and dispatches it at the next claim, so the request waits for an agent instead
of failing its run for good. Deletes only the test's own namespace's queue."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import Engine

from sasflow.transport.topology import Names
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration


def _submit(engine: Engine, names: Names, key: str) -> int:
    return harness.submit(
        engine, basic.registry, names, "pipeline", key=key, run_input={"text": key}
    )


def _step_a(engine: Engine, run_id: int) -> tuple[str, int]:
    row = next(r for r in harness.step_rows(engine, run_id) if r.name == "a")
    return row.state, row.failure_count


def test_a_request_to_a_deleted_agent_queue_waits_for_the_agent_instead_of_failing(
    engine: Engine, database_url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.agent("echo")
    scheduler = harness.scheduler(engine, database_url, basic.registry, names)
    with harness.running(scheduler):
        first = _submit(engine, names, "first")  # makes the scheduler declare the queue
        harness.wait_for(lambda: services.queue_exists(queue), what="the agent queue declared")
        harness.wait_for(lambda: _step_a(engine, first)[0] == "processing", what="first sent")
        with services.broker_channel() as channel:
            channel.queue_delete(queue)  # the first request goes with it (the sweep's case)
        with caplog.at_level(logging.WARNING):
            second = _submit(engine, names, "second")
            harness.wait_for(
                lambda: services.queue_exists(queue), what="the agent queue declared again"
            )
            harness.wait_for(
                lambda: _step_a(engine, second)[0] == "processing", what="second dispatched"
            )
        assert _step_a(engine, second) == ("processing", 0)
        assert [r.getMessage() for r in caplog.records if "no queue for agent" in r.getMessage()]
        with harness.running(harness.agent(basic.echo, names)):
            harness.wait_for(
                lambda: harness.run_states(engine).get(second) == "completed",
                what="the second run completed by the agent started afterwards",
            )
    second_steps = harness.step_rows(engine, second)
    assert [(r.name, r.state, r.failure_count) for r in second_steps] == [
        ("a", "processed", 0),
        ("b", "processed", 0),
    ]
    assert harness.run_states(engine)[first] != "error"
