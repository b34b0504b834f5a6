"""Event waits on the embedded default (SQLite): an event before its wait is taken when the
wait opens, one after is matched at once, the same id again changes nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select, update

from sasflow import submit_run
from sasflow.store.db import transaction
from sasflow.store.inbound import ingest
from sasflow.store.runs.advance import advance_runs
from sasflow.store.runs.events import record
from sasflow.store.schema import steps
from tests.apps.events import registry


def _event(correlation: str, event_id: str) -> ingest.InboundEvent:
    return ingest.InboundEvent("payment_confirmed", correlation, event_id, {"id": event_id})


def _send(engine: Engine, correlation: str, event_id: str) -> ingest.Stored:
    with transaction(engine) as conn:
        return ingest.store_event(
            conn, _event(correlation, event_id), source="cli", namespace="t", actor="test"
        )


def _open(engine: Engine, run_id: int) -> None:
    with transaction(engine) as conn:
        conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.name == "reserve")
            .values(state="processed", output={})
        )
        record(conn, advance_runs(conn, registry, [run_id], actor="test").events)


def _paid(engine: Engine, run_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(steps.c.state, steps.c.output).where(
                steps.c.run_id == run_id, steps.c.name == "paid"
            )
        ).one()


def test_event_waits_match_both_ways_once_on_sqlite(sqlite_engine: Engine) -> None:
    with transaction(sqlite_engine) as conn:
        early = submit_run(conn, registry, "order", {"order_id": "1"}, key="1", namespace="t")
        late = submit_run(conn, registry, "order", {"order_id": "2"}, key="2", namespace="t")
    assert _send(sqlite_engine, "1", "a").step_id is None
    _open(sqlite_engine, early.run_id)
    _open(sqlite_engine, late.run_id)
    assert tuple(_paid(sqlite_engine, early.run_id)) == ("processed", {"id": "a"})
    assert _paid(sqlite_engine, late.run_id).state == "pending"
    first = _send(sqlite_engine, "2", "b")
    again = _send(sqlite_engine, "2", "b")
    assert (first.created, again.created, again.step_id) == (True, False, first.step_id)
    assert tuple(_paid(sqlite_engine, late.run_id)) == ("processed", {"id": "b"})
