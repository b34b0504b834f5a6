"""Claiming: one statement, batch-limited, priority-ordered, ready-only, never twice."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine, func, select, update

from sasflow import submit_run
from sasflow.store.db import transaction
from sasflow.store.runs.claim import ClaimedStep, claim_steps
from sasflow.store.schema import steps
from tests import claim_order
from tests.apps import basic

pytestmark = pytest.mark.integration


def _submit_many(
    engine: Engine, count: int, workflow: str = "pipeline", priority: int = 0, prefix: str = "r"
) -> list[int]:
    with engine.begin() as conn:
        return [
            submit_run(
                conn,
                basic.registry,
                workflow,
                {"text": f"t{i}"},
                key=f"{prefix}{i}",
                priority=priority,
                namespace="t",
            ).run_id
            for i in range(count)
        ]


def test_claim_takes_at_most_the_batch_in_priority_order_and_only_ready_steps(
    engine: Engine,
) -> None:
    """Higher priority first; waiting (dependent) steps and steps backed off into the future
    are not claimed; each claim sets processing, locked_by, complete_by and attempt 1."""
    low = _submit_many(engine, 3, priority=0, prefix="low")
    high = _submit_many(engine, 2, priority=5, prefix="high")
    with engine.begin() as conn:
        conn.execute(
            update(steps)
            .where(steps.c.run_id == low[2])
            .values(not_before=func.now() + func.make_interval(0, 0, 0, 0, 1))
        )
    with transaction(engine) as conn:
        first = claim_steps(conn, locked_by="s1", batch=3)
    assert [c.run_id for c in first] == [*high, low[0]]
    assert {c.name for c in first} == {"a"}
    with transaction(engine) as conn:
        second = claim_steps(conn, locked_by="s1", batch=10)
    assert [c.run_id for c in second] == [low[1]]  # low[2] is backed off; every "b" waits
    with engine.connect() as conn:
        row = conn.execute(select(steps).where(steps.c.id == first[0].id)).one()
        now = conn.execute(select(func.now())).scalar_one()
    assert (row.state, row.locked_by, row.attempt) == ("processing", "s1", 1)
    assert row.complete_by is not None
    assert row.started_at is None
    # The envelope: the wait timeout (30 s) then the timeout (10 s), from the claim.
    assert 39 < (row.complete_by - now).total_seconds() <= 40.5


def test_concurrent_claimers_never_claim_a_row_twice(engine: Engine) -> None:
    """Four threads claim 1,000 ready steps in batches of 50 with SKIP LOCKED: together they
    claim every step exactly once."""
    _submit_many(engine, 1000)
    claimed: dict[str, list[ClaimedStep]] = {f"c{i}": [] for i in range(4)}
    barrier = threading.Barrier(4)

    def claimer(name: str) -> None:
        barrier.wait()
        while True:
            with transaction(engine) as conn:
                batch = claim_steps(conn, locked_by=name, batch=50)
            if not batch:
                return
            claimed[name].extend(batch)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    ids = [c.id for batch in claimed.values() for c in batch]
    assert len(ids) == 1000
    assert len(set(ids)) == 1000
    assert sum(1 for batch in claimed.values() if batch) >= 2, "claimers did not overlap"
    with engine.connect() as conn:
        rows = conn.execute(
            select(steps.c.id, steps.c.locked_by, steps.c.attempt).where(
                steps.c.state == "processing"
            )
        ).all()
    owner = {c.id: name for name, batch in claimed.items() for c in batch}
    assert len(rows) == 1000
    assert all(r.attempt == 1 and owner[r.id] == r.locked_by for r in rows)


def test_a_claim_answers_highest_priority_first_then_by_id(engine: Engine) -> None:
    """The same order as SQLite's (tests/embedded/test_sqlite_claims.py)."""
    claim_order.claimed_in_order(engine)
