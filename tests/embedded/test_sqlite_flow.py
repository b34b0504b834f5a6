"""The budgeted claim on the SQLite state store (the embedded default runs the same Python, its
one writer serializing claims instead of row locks): rates with their burst, keys of the run's
input compared as PostgreSQL compares them, held steps untouched, and their waiting reasons."""

from __future__ import annotations

import threading
import time

from sqlalchemy import Engine, select, update

from sasflow import submit_run
from sasflow.store.db import transaction
from sasflow.store.flow import limits
from sasflow.store.flow.claim import claim_budgeted
from sasflow.store.flow.explain import waiting_reasons
from sasflow.store.flow.fleet import read_fleet
from sasflow.store.flow.model import KeyExpr, Limit
from sasflow.store.flow.plan import FlowPlan, make_plan
from sasflow.store.schema import steps
from tests.apps import flow


def _submit(engine: Engine, accounts: list[object]) -> None:
    with engine.begin() as conn:
        for i, account in enumerate(accounts):
            submit_run(
                conn, flow.registry, "charge", {"account": account}, key=f"r{i}", namespace="t"
            )


def _plan(engine: Engine, *defined: Limit) -> FlowPlan:
    with transaction(engine) as conn:
        for limit in defined:
            limits.save(conn, limit, actor="test", reason="test")
        return make_plan(limits.enabled_limits(conn), read_fleet(conn))


def test_a_rate_admits_its_burst_and_refills_on_sqlite(sqlite_engine: Engine) -> None:
    _submit(sqlite_engine, [f"a{i}" for i in range(20)])
    plan = _plan(sqlite_engine, Limit("pay-rate", "pay", rate=1, burst=4))
    with transaction(sqlite_engine) as conn:
        first = claim_budgeted(conn, plan, locked_by="s1", batch=100)
    with sqlite_engine.connect() as conn:
        held = conn.execute(
            select(steps.c.id, steps.c.not_before, steps.c.failure_count).where(
                steps.c.state == "pending"
            )
        ).all()
    with transaction(sqlite_engine) as conn:
        again = claim_budgeted(conn, plan, locked_by="s1", batch=100)
        after = conn.execute(
            select(steps.c.id, steps.c.not_before, steps.c.failure_count).where(
                steps.c.state == "pending"
            )
        ).all()
    assert (len(first.claimed), again.claimed, after) == (4, [], held)
    time.sleep(2.2)  # two calls' worth at 1/s
    with transaction(sqlite_engine) as conn:
        assert len(claim_budgeted(conn, plan, locked_by="s1", batch=100).claimed) == 2


def test_keys_of_numbers_and_strings_are_limited_per_value_across_threads(
    sqlite_engine: Engine,
) -> None:
    """Accounts given as integers and strings: one step per account at a time, whichever of
    three threads claims (the steps claimed are finished at once)."""
    _submit(sqlite_engine, [7, 7, "x", "x", 8, 7])
    plan = _plan(
        sqlite_engine,
        Limit("per-account", "pay", key=KeyExpr.parse("input.account"), concurrency=1),
    )
    rounds: list[list[str]] = []
    lock = threading.Lock()

    def claimer() -> None:
        with transaction(sqlite_engine) as conn:
            got = claim_budgeted(conn, plan, locked_by="s", batch=100)
        with lock:
            rounds.append(sorted(str(c.input["account"]) for c in got.claimed))

    threads = [threading.Thread(target=claimer) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(a for r in rounds for a in r) == ["7", "8", "x"]
    with sqlite_engine.connect() as conn:
        rows = (
            conn.execute(
                select(
                    steps.c.id,
                    steps.c.run_id,
                    steps.c.agent,
                    steps.c.action,
                    steps.c.state,
                    steps.c.not_before,
                )
            )
            .mappings()
            .all()
        )
        reasons = waiting_reasons(conn, rows)
    assert sorted(reasons.values()) == [
        "concurrency: per-account 1 at once (key 7)",
        "concurrency: per-account 1 at once (key 7)",
        "concurrency: per-account 1 at once (key x)",
    ]
    with sqlite_engine.begin() as conn:
        conn.execute(update(steps).where(steps.c.state == "processing").values(state="processed"))
    with transaction(sqlite_engine) as conn:
        second = claim_budgeted(conn, plan, locked_by="s", batch=100)
    assert sorted(str(c.input["account"]) for c in second.claimed) == ["7", "x"]
