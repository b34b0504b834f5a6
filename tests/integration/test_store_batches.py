"""Batch statements on PostgreSQL: events appended with COPY, id lists as one array parameter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, Engine, select, text
from sqlalchemy.exc import IntegrityError, OperationalError

from sasflow import submit_run
from sasflow.errors import ConflictError
from sasflow.states import RunState, StepState
from sasflow.store.db import is_disconnect, transaction, translated
from sasflow.store.runs import events, queries
from sasflow.store.schema import events as events_table
from tests.apps import basic

pytestmark = pytest.mark.integration


def _runs(engine: Engine, count: int) -> list[int]:
    with engine.begin() as conn:
        return [
            submit_run(
                conn, basic.registry, "pipeline", {"text": f"t{i}"}, key=f"k{i}", namespace="t"
            ).run_id
            for i in range(count)
        ]


def _varied(run_ids: list[int], actor: str) -> list[events.Event]:
    """Events exercising every column: NULLs, JSON with unicode and nesting, quiet and not."""
    details: list[Any] = [
        None,
        {"error": {"type": "Timeout", "message": "délai \u00e9coulé"}},
        {"n": [1, 2.5, None, True], "s": "tab\there\nnewline \\ backslash"},
        "a JSON string",
        42,
    ]
    return [
        events.Event(
            run_id=run_ids[i % len(run_ids)],
            entity="step" if i % 3 else "run",
            to_state=(StepState.PENDING, StepState.PROCESSED, StepState.ERROR)[i % 3],
            actor=actor,
            from_state=None if i % 4 == 0 else StepState.PROCESSING,
            step_id=None if i % 5 == 0 else 1000 + i,
            step=None if i % 6 == 0 else "b",
            attempt=None if i % 7 == 0 else i,
            reason=None if i % 2 else "why\\N not",
            detail=details[i % len(details)],
        )
        for i in range(events.COPY_FROM * 2)
    ]


def _stored(engine: Engine, actor: str) -> list[tuple[Any, ...]]:
    columns = [c for c in events_table.c if c.name not in ("id", "actor", "created_at")]
    with engine.begin() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                select(*columns).where(events_table.c.actor == actor).order_by(events_table.c.id)
            )
        ]


def test_a_large_batch_is_copied_and_stored_exactly_as_inserts_store_it(
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    copies: list[int] = []
    copy = events._copy

    def counted(conn: Connection, batch: Sequence[events.Event]) -> None:
        copies.append(len(batch))
        copy(conn, batch)

    monkeypatch.setattr(events, "_copy", counted)
    run_ids = _runs(engine, 3)
    copied, inserted = _varied(run_ids, "copy"), _varied(run_ids, "insert")
    with transaction(engine) as conn:
        events.record(conn, copied)  # one COPY
        for event in inserted:
            events.record(conn, [event])  # one INSERT each
    assert copies == [events.COPY_FROM * 2]
    assert len(_stored(engine, "copy")) == events.COPY_FROM * 2
    assert _stored(engine, "copy") == _stored(engine, "insert")


def test_a_copy_that_fails_leaves_nothing_and_the_transaction_rolls_back(engine: Engine) -> None:
    run_ids = _runs(engine, 1)
    batch = _varied(run_ids, "bad")
    batch[-1] = events.Event(
        run_id=run_ids[0] + 10_000, entity="run", to_state=RunState.COMPLETED, actor="bad"
    )  # no such run: the foreign key refuses it
    with pytest.raises(IntegrityError), transaction(engine) as conn:  # as an INSERT's would
        events.record(conn, batch)
    assert _stored(engine, "bad") == []


def test_a_connection_lost_during_copy_is_a_disconnect_as_for_any_statement(
    engine: Engine,
) -> None:
    run_ids = _runs(engine, 1)
    conn = engine.connect()
    try:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with engine.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(OperationalError) as raised:
            events.record(conn, _varied(run_ids, "lost"))
    finally:
        conn.invalidate()  # its server process is gone: the pool must not take it back
        conn.close()
    assert is_disconnect(raised.value)
    assert _stored(engine, "lost") == []


def test_a_deadlock_in_copy_is_a_conflict_to_retry() -> None:
    """db.translated turns what events.driver_error makes of a deadlock into ConflictError,
    which run_transaction retries, as for a deadlock in an INSERT."""
    error = events.driver_error(
        "COPY events FROM STDIN", psycopg.errors.DeadlockDetected("deadlock detected")
    )
    with pytest.raises(ConflictError), translated():
        raise error


@pytest.mark.parametrize("size", [0, 1, 700])
def test_id_lists_are_one_array_parameter_of_any_length(engine: Engine, size: int) -> None:
    run_ids = _runs(engine, 3)
    wanted = [*run_ids[:2], *range(10**9, 10**9 + size - 2)] if size >= 2 else run_ids[:size]
    with engine.begin() as conn:
        statement = queries.lock_runs(skip_locked=False)
        compiled = str(statement.compile(conn))
        found = conn.execute(statement, {"b_run_ids": wanted}).scalars().all()
    assert "ANY" in compiled
    assert found == sorted(r for r in run_ids if r in wanted)
