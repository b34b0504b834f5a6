"""Claims on the SQLite state store: atomic across threads and processes under its write
lock, backed-off steps left out, agents at their in-flight bound left out and counted."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import threading
import time

import pytest
from sqlalchemy import Engine, func, select, update

from sasflow.states import StepState
from sasflow.store.db import make_engine, run_transaction, transaction
from sasflow.store.runs.claim import ClaimedStep, claim_steps, in_flight
from sasflow.store.schema import events, steps
from sasflow.store.sqltime import now, plus_seconds
from tests import claim_order
from tests.embedded.runs import submit_pipelines


def test_steps_backed_off_into_the_future_are_not_claimed(sqlite_engine: Engine) -> None:
    later, ready = submit_pipelines(sqlite_engine, 2)
    with transaction(sqlite_engine) as conn:
        conn.execute(
            update(steps).where(steps.c.run_id == later).values(not_before=plus_seconds(now(), 5))
        )
        claimed = claim_steps(conn, locked_by="s1", batch=10)
        db_now = conn.execute(select(now())).scalar_one()
    assert [c.run_id for c in claimed] == [ready]
    assert claimed[0].workflow == "pipeline"
    assert claimed[0].complete_by.tzinfo == dt.UTC
    # The envelope: wait timeout (30 s) then timeout (10 s).
    assert (claimed[0].complete_by - db_now).total_seconds() == pytest.approx(40, abs=0.5)


def test_agents_at_their_in_flight_bound_are_left_out_and_counted(sqlite_engine: Engine) -> None:
    submit_pipelines(sqlite_engine, 2)
    with transaction(sqlite_engine) as conn:
        assert claim_steps(conn, locked_by="s1", batch=10, skip_agents=["echo"]) == []
        assert in_flight(conn, locked_by="s1") == {}
        claimed = claim_steps(conn, locked_by="s1", batch=10, skip_agents=["other"])
        assert [c.agent for c in claimed] == ["echo", "echo"]
        assert in_flight(conn, locked_by="s1") == {"echo": 2}
        assert in_flight(conn, locked_by="s2") == {}


def test_eight_threads_claim_2000_ready_steps_each_exactly_once(sqlite_engine: Engine) -> None:
    """Eight claimers, batches of 25: every step claimed once, by the claimer recorded on it,
    with one dispatch event each, and none left pending."""
    submit_pipelines(sqlite_engine, 2000)
    claimed: dict[str, list[ClaimedStep]] = {f"c{i}": [] for i in range(8)}
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def claimer(name: str) -> None:
        try:
            barrier.wait()
            while True:
                batch = run_transaction(
                    sqlite_engine, lambda conn: claim_steps(conn, locked_by=name, batch=25)
                )
                if not batch:
                    return
                assert len(batch) <= 25
                claimed[name].extend(batch)
                # A scheduler publishes between claims. Without a pause the thread that just
                # committed takes the lock again before the busy handlers of the others wake
                # (SQLite's lock is not fair), and the test would not overlap claimers.
                time.sleep(0.002)
        except Exception as exc:
            errors.append(exc)
            raise

    threads = [threading.Thread(target=claimer, args=(n,)) for n in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    ids = [c.id for batch in claimed.values() for c in batch]
    assert len(ids) == 2000
    assert len(set(ids)) == 2000
    assert sum(1 for batch in claimed.values() if batch) >= 2, "claimers did not overlap"
    owner = {c.id: name for name, batch in claimed.items() for c in batch}
    with sqlite_engine.connect() as conn:
        rows = conn.execute(
            select(steps.c.id, steps.c.locked_by, steps.c.attempt).where(
                steps.c.state == StepState.PROCESSING
            )
        ).all()
        left = conn.execute(
            select(func.count()).select_from(steps).where(steps.c.state == StepState.PENDING)
        ).scalar_one()
        dispatched = conn.execute(
            select(func.count())
            .select_from(events)
            .where(events.c.to_state == StepState.PROCESSING)
        ).scalar_one()
    assert left == 0
    assert {r.id: r.locked_by for r in rows} == owner
    assert {r.attempt for r in rows} == {1}
    assert dispatched == 2000


def _claim_until_empty(url: str, name: str, barrier: threading.Barrier) -> list[int]:
    """A claimer process: its own engine, batches of 20 until nothing is ready."""
    engine = make_engine(url, pool_size=1)
    barrier.wait(60)  # start together, once every process is up
    ids: list[int] = []
    try:
        while batch := run_transaction(
            engine, lambda conn: claim_steps(conn, locked_by=name, batch=20)
        ):
            ids.extend(c.id for c in batch)
            time.sleep(0.002)
    finally:
        engine.dispose()
    return ids


def test_three_processes_claim_900_ready_steps_each_exactly_once(
    sqlite_engine: Engine,
    sqlite_url: str,
) -> None:
    """The write lock is the database file's, so claims are atomic across processes too."""
    submit_pipelines(sqlite_engine, 900)
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(3) as pool:
        barrier = manager.Barrier(3)
        results = pool.starmap(
            _claim_until_empty, [(sqlite_url, f"p{i}", barrier) for i in range(3)]
        )
    ids = [i for claimed in results for i in claimed]
    assert len(ids) == 900
    assert len(set(ids)) == 900
    assert sum(1 for claimed in results if claimed) >= 2, "claimers did not overlap"
    with sqlite_engine.connect() as conn:
        owners = dict(
            conn.execute(
                select(steps.c.id, steps.c.locked_by).where(steps.c.state == StepState.PROCESSING)
            ).all()
        )
    assert owners == {i: f"p{n}" for n, claimed in enumerate(results) for i in claimed}


def test_a_claim_answers_highest_priority_first_then_by_id(sqlite_engine: Engine) -> None:
    """The same order as PostgreSQL's (tests/integration/test_claim.py)."""
    claim_order.claimed_in_order(sqlite_engine)
