"""The README's example app runs as shown."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select

from sasflow import submit_run
from sasflow.agents import Agent
from sasflow.appload import load_registry
from sasflow.store.schema import runs
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration


def test_quickstart_order_completes_and_a_too_large_order_fails_permanently(
    engine: Engine, database_url: str, names: Names
) -> None:
    registry = load_registry("examples.quickstart")
    with engine.begin() as conn:
        ok = submit_run(
            conn,
            registry,
            "order",
            {"sku": "A-1", "qty": 2},
            key="order-1001",
            namespace=names.namespace,
        )
        bad = submit_run(
            conn,
            registry,
            "order",
            {"sku": "A-1", "qty": 500},
            key="order-1002",
            namespace=names.namespace,
        )
    agents = [harness.agent(a, names) for a in registry.agents if isinstance(a, Agent)]
    assert len(agents) == 2
    with harness.running(harness.scheduler(engine, database_url, registry, names), *agents):
        harness.wait_for(harness.all_runs_in(engine, {"completed", "error"}, 2), what="runs end")
    with engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(select(runs))}
    assert rows[ok.run_id].state == "completed"
    assert rows[ok.run_id].output["charge"]["charged"] == 10
    assert rows[bad.run_id].state == "error"
    error = rows[bad.run_id].error["error"]
    assert (error["type"], error["message"]) == ("PermanentError", "quantity too large")
