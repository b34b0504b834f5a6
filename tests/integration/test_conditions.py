"""Conditions on the real services (docs/concepts.md "Conditions"): the same workflow runs its
conditional step for one run and skips it, and what depends only on it, for another; both
complete, and the history and `runs show` say why a step was skipped, with the values read."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow.commands import NewRun
from sasflow.store.db import transaction
from sasflow.store.runs.submit import submit
from sasflow.store.schema import events, runs
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import conditions

pytestmark = pytest.mark.integration


def _submit(engine: Engine, names: Names, key: str, capture: bool) -> int:
    with transaction(engine) as conn:
        return submit(
            conn,
            conditions.registry,
            NewRun(workflow="refunds", key=key, input={"capture": capture, "amount": 12}),
            namespace=names.namespace,
            actor="test",
        ).run_id


def _step_events(engine: Engine, run_id: int) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(events.c.step, events.c.to_state, events.c.reason, events.c.detail)
                .where(events.c.run_id == run_id, events.c.entity == "step")
                .order_by(events.c.id)
            )
        )


def test_a_condition_runs_its_step_for_one_run_and_skips_it_for_another(
    engine: Engine, database_url: str, names: Names
) -> None:
    captured = _submit(engine, names, "cap-1", capture=True)
    declined = _submit(engine, names, "dec-1", capture=False)
    with harness.running(
        harness.scheduler(engine, database_url, conditions.registry, names),
        harness.agent(conditions.shop, names),
    ):
        harness.wait_for(harness.all_runs_in(engine, {"completed"}, 2), what="runs complete")

    ran = {r.name: r for r in harness.step_rows(engine, captured)}
    assert {n: r.state for n, r in ran.items()} == dict.fromkeys(
        ("charge", "refund", "receipt", "audit", "close"), "processed"
    )
    skipped = {r.name: r for r in harness.step_rows(engine, declined)}
    assert {n: r.state for n, r in skipped.items()} == {
        "charge": "processed",
        "refund": "skipped",  # its condition is false
        "receipt": "skipped",  # it depends only on refund
        "audit": "processed",  # a fan-in with charge processed runs
        "close": "processed",  # if_skipped="run"
    }
    assert skipped["refund"].attempt == 0  # never claimed
    assert skipped["receipt"].attempt == 0
    with engine.connect() as conn:
        outputs = dict(conn.execute(select(runs.c.id, runs.c.output)).all())
    assert outputs[declined] == {"audit": {"step": "audit"}, "close": {"step": "close"}}

    history = [e for e in _step_events(engine, declined) if e.to_state == "skipped"]
    assert [(e.step, e.reason, e.detail) for e in history] == [
        (
            "refund",
            "condition false",
            {
                "condition": "steps.charge.captured == True",
                "values": {"steps.charge.captured": False},
            },
        ),
        ("receipt", "dependencies skipped", {"skipped": ["refund"]}),
    ]
    assert not [e for e in _step_events(engine, captured) if e.to_state == "skipped"]

    shown = harness.cli(database_url, names, "tests.apps.conditions:registry", expect=0)(
        "runs", "show", str(declined)
    )
    assert (
        "step refund skipped: condition false: steps.charge.captured == True; "
        "read steps.charge.captured=false"
    ) in shown.output
    assert "step receipt skipped: dependencies skipped: refund" in shown.output
