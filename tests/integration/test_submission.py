"""Submission: in the caller's transaction, through the submitter, idempotent, poison-proof."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, func, insert, select

from sasflow import InvalidInputError, UnknownWorkflowError, submit_run
from sasflow.store.db import make_engine
from sasflow.store.schema import runs, steps
from sasflow.transport.topology import REASON_HEADER, SOURCE_HEADER, Names
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration

business = MetaData()
orders = Table(
    "orders", business, Column("id", Integer, primary_key=True), Column("item", String(50))
)


def _count(engine: Engine, table: Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_run_commits_and_rolls_back_with_the_callers_own_rows(
    engine: Engine, owner_database_url: str
) -> None:
    """The order row and its run are one fact: both commit, or neither does. (The app's table
    is created by the owner role, as the app's migrations would be; the runtime role writes.)"""
    owner = make_engine(owner_database_url, pool_size=1)
    try:
        business.create_all(owner)
    finally:
        owner.dispose()
    with engine.begin() as conn:
        conn.execute(insert(orders).values(id=1, item="book"))
        submit_run(conn, basic.registry, "pipeline", {"text": "book"}, key="order-1", namespace="t")

    def place_order_then_fail() -> None:
        with engine.begin() as conn:
            conn.execute(insert(orders).values(id=2, item="lamp"))
            submit_run(
                conn, basic.registry, "pipeline", {"text": "lamp"}, key="order-2", namespace="t"
            )
            raise RuntimeError("payment declined")

    with pytest.raises(RuntimeError, match="payment declined"):
        place_order_then_fail()
    assert _count(engine, orders) == 1
    with engine.connect() as conn:
        keys = conn.execute(select(runs.c.business_key)).scalars().all()
    assert keys == ["order-1"]
    assert _count(engine, steps) == 2


def test_same_key_twice_is_one_run(engine: Engine) -> None:
    """A duplicate submission returns the existing run and inserts nothing."""
    with engine.begin() as conn:
        first = submit_run(conn, basic.registry, "pipeline", {"text": "x"}, key="k", namespace="t")
    with engine.begin() as conn:
        second = submit_run(conn, basic.registry, "pipeline", {"text": "x"}, key="k", namespace="t")
    assert (first.created, second.created) == (True, False)
    assert first.run_id == second.run_id
    assert (_count(engine, runs), _count(engine, steps)) == (1, 2)


def test_unknown_workflow_and_non_json_input_are_rejected(engine: Engine) -> None:
    with engine.begin() as conn, pytest.raises(UnknownWorkflowError, match="nope"):
        submit_run(conn, basic.registry, "nope", {}, namespace="t")
    with engine.begin() as conn, pytest.raises(InvalidInputError):
        submit_run(conn, basic.registry, "pipeline", {"when": object()}, namespace="t")
    assert _count(engine, runs) == 0


def test_submitter_inserts_dedupes_and_dead_letters_poison_while_serving(
    engine: Engine, names: Names
) -> None:
    """Valid submissions become runs (duplicates once); malformed JSON, a schema violation and
    an unknown workflow each end in the dead-letter queue with a reason; the submitter keeps
    serving after them."""
    role = harness.submitter(engine, basic.registry, names)
    with harness.running(role):
        harness.wait_for(
            lambda: role.stats is not None and services.queue_exists(names.submit),
            what="submit queue",
        )
        good = json.dumps({"workflow": "pipeline", "key": "o-1", "input": {"text": "a"}})
        harness.publish_raw(names.submit, good.encode())
        harness.publish_raw(names.submit, b"{not json")
        harness.publish_raw(
            names.submit, json.dumps({"workflow": "pipeline", "priority": "high"}).encode()
        )
        harness.publish_raw(names.submit, json.dumps({"workflow": "ghost"}).encode())
        harness.publish_raw(names.submit, good.encode())
        harness.publish_raw(
            names.submit,
            json.dumps({"workflow": "diamond", "key": "o-2", "input": {"text": "b"}}).encode(),
        )
        harness.wait_for(lambda: _count(engine, runs) == 2, what="two runs")
        dead = harness.dead_letters(names, 3)
    reasons = sorted(str(d["reason"]) for d in dead)
    assert "not UTF-8 JSON" in reasons[0] or "not UTF-8 JSON" in " ".join(reasons)
    assert any("priority" in r for r in reasons)
    assert any("unknown workflow 'ghost'" in r for r in reasons)
    assert {d["headers"][SOURCE_HEADER] for d in dead} == {names.submit}
    assert all(d["headers"][REASON_HEADER] for d in dead)
    assert role.stats.created == 2
    assert role.stats.duplicates == 1
    assert role.stats.dead_lettered == 3
