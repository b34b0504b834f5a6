"""`sasflow_runs_finished_total{workflow,state}` on PostgreSQL and RabbitMQ: every path that ends
a run names its workflow (the scheduler applying replies, the supervisor escalating an
expired step, a run's deadline cancelling it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call, PermanentError
from sasflow.observability.exposition import new_registry
from sasflow.observability.metrics import SchedulerMetrics, SupervisorMetrics
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration

FINISHED = "sasflow_runs_finished_total"


class App:
    """Workflows `orders` (passes, or fails for good on input {"fail": true}), `slow` (one
    attempt that outlives its timeout) and `late` (a deadline that cancels it)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        agent = Agent("shop")

        @agent.handler("do")
        def do(call: Call) -> dict[str, Any]:
            if call.input.get("fail"):
                raise PermanentError("refused")
            return {}

        @agent.handler("hang")
        def hang(call: Call) -> dict[str, Any]:
            self.release.wait(call.remaining() + 5)
            return {}

        once = StepPolicy(timeout=0.5, max_failures=1)
        self.registry = Registry(
            [
                Workflow("orders", [Step("do", "shop", "do")]),
                Workflow("slow", [Step("hang", "shop", "hang", policy=once)]),
                Workflow(
                    "late",
                    [Step("hang", "shop", "hang", policy=StepPolicy(timeout=20))],
                    deadline=0.5,
                    on_deadline="cancel",
                ),
            ],
            [agent],
        )
        self.agent = agent


@pytest.fixture
def app() -> Iterator[App]:
    made = App()
    yield made
    made.release.set()


def _submit(engine: Engine, app: App, names: Names, workflow: str, key: str, **data: Any) -> int:
    with engine.begin() as conn:
        return submit_run(
            conn, app.registry, workflow, data, key=key, namespace=names.namespace
        ).run_id


def test_each_path_that_ends_a_run_counts_it_under_its_workflow(
    engine: Engine, database_url: str, names: Names, app: App
) -> None:
    on_scheduler, on_supervisor = new_registry(), new_registry()
    supervisor = Supervisor(
        engine,
        names,
        transport=harness.transport("supervisor"),
        options=SupervisorOptions(interval=0.1),
        hooks=SupervisorMetrics(on_supervisor),
    )
    ids = {
        "ok": _submit(engine, app, names, "orders", "ok"),
        "refused": _submit(engine, app, names, "orders", "refused", fail=True),
        "slow": _submit(engine, app, names, "slow", "slow"),
        "late": _submit(engine, app, names, "late", "late"),
    }
    expected = {
        ids["ok"]: "completed",
        ids["refused"]: "error",
        ids["slow"]: "error",
        ids["late"]: "cancelled",
    }
    try:
        with harness.running(
            harness.scheduler(
                engine,
                database_url,
                app.registry,
                names,
                hooks=SchedulerMetrics(on_scheduler),
                rescan_interval=0.1,
            ),
            harness.agent(app.agent, names),
            supervisor,
        ):
            harness.wait_for(lambda: harness.run_states(engine) == expected, timeout=30)
            # The hooks ran inside the transactions whose commits this waited for.
            app.release.set()  # the hanging handlers return (their late replies are fenced)
    finally:
        app.release.set()
        supervisor.close()

    def counted(registry: Any, workflow: str, state: str) -> float | None:
        value: float | None = registry.get_sample_value(
            FINISHED, {"workflow": workflow, "state": state}
        )
        return value

    assert counted(on_scheduler, "orders", "completed") == 1
    assert counted(on_scheduler, "orders", "error") == 1
    assert counted(on_supervisor, "slow", "error") == 1  # escalated by the sweep
    assert counted(on_supervisor, "late", "cancelled") == 1  # its deadline
    assert counted(on_scheduler, "unknown", "error") is None
    assert counted(on_supervisor, "unknown", "cancelled") is None
