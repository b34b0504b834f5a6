"""Ending an item of a map does not read its run (store.runs.map_drain; docs/concepts.md "Map
steps", Cost): while the map goes on, the transaction that applies the reply counts the map's
items and releases the next waiting ones in index order, within the map's parallelism; only
the reply that ends the map reads the run's steps and decides it (outputs joined in order).
Replies applied by hand (claim, apply) on the real database."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow.commands import StepOutcome, StoredError
from sasflow.states import ReplyStatus
from sasflow.store.runs import queries
from sasflow.store.runs.claim import ClaimedStep
from sasflow.store.schema import events, runs, steps
from sasflow.transport.topology import Names
from tests import map_runs

pytestmark = pytest.mark.integration

LINES = 12
"""Items of the map: parallelism 5, so 7 wait at first."""


@pytest.fixture
def run_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the reads of every step of a run (queries.steps_of_runs) while a test applies."""
    calls: list[int] = []
    real: Callable[[], Any] = queries.steps_of_runs

    def counted() -> Any:
        calls.append(1)
        return real()

    monkeypatch.setattr(queries, "steps_of_runs", counted)
    return calls


def _started_map(engine: Engine, names: Names, workflow: str) -> tuple[int, list[ClaimedStep]]:
    run_id, claimed = map_runs.started_map(engine, names, workflow, LINES)
    assert [s.name for s in claimed] == [f"reserve[{i}]" for i in range(5)]
    return run_id, claimed


def _items(engine: Engine, run_id: int) -> dict[int, str]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(steps.c.map_index, steps.c.state).where(
                steps.c.run_id == run_id, steps.c.map_parent.is_not(None)
            )
        ).all()
    return {r.map_index: r.state for r in rows}


def _state(engine: Engine, run_id: int, name: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                select(steps.c.state).where(steps.c.run_id == run_id, steps.c.name == name)
            ).scalar_one()
        )


def test_items_end_without_reading_the_run_until_the_last_one(
    engine: Engine, names: Names, run_reads: list[int]
) -> None:
    run_id, claimed = _started_map(engine, names, "orders")
    run_reads.clear()

    # Item 2 ends: the next waiting item (5) is released, the run's steps are not read.
    map_runs.apply(engine, names, map_runs.ok(claimed[2], {"index": 2}))
    assert run_reads == []
    states = _items(engine, run_id)
    assert states[2] == "processed"
    assert states[5] == "pending"
    assert [states[i] for i in range(6, LINES)] == ["waiting"] * (LINES - 6)
    with engine.connect() as conn:
        released = conn.execute(
            select(events.c.step, events.c.from_state, events.c.to_state, events.c.reason).where(
                events.c.run_id == run_id, events.c.step == "reserve[5]"
            )
        ).all()
    assert [tuple(r) for r in released] == [("reserve[5]", "waiting", "pending", "map")]

    # Drain the rest, one reply at a time: never more than 5 running, released in index order.
    in_flight = {s.id: s for s in claimed if s.id != claimed[2].id}
    while in_flight:
        step = in_flight.pop(min(in_flight))
        index = int(step.name.removeprefix("reserve[").removesuffix("]"))
        map_runs.apply(engine, names, map_runs.ok(step, {"index": index}))
        states = _items(engine, run_id)
        running = [i for i, s in states.items() if s in {"pending", "processing"}]
        assert len(running) <= 5
        waiting = [i for i, s in states.items() if s == "waiting"]
        assert all(w > r for w in waiting for r in running)
        in_flight |= {s.id: s for s in map_runs.claim(engine, run_id)}
        if in_flight:
            assert run_reads == []  # the map goes on: the run was not read
    # The last item ended the map: that decision read the run, joined the outputs in order.
    assert run_reads != []
    assert _state(engine, run_id, "reserve") == "processed"
    with engine.connect() as conn:
        output = conn.execute(
            select(steps.c.output).where(steps.c.run_id == run_id, steps.c.name == "reserve")
        ).scalar_one()
    assert output == [{"index": i} for i in range(LINES)]
    # `ship` builds its input from the map's output: left to a scheduler's advance duty.
    with engine.connect() as conn:
        wanted = select(runs.c.state, runs.c.advance_due).where(runs.c.id == run_id)
        run = conn.execute(wanted).one()
    assert run.state == "running"
    assert run.advance_due is not None


FAILURE = StoredError("OutOfStock", "line is out of stock")


def _fail(step: ClaimedStep) -> StepOutcome:
    return StepOutcome(step.id, step.attempt, ReplyStatus.ERROR, error=FAILURE)


def test_an_item_failing_under_continue_releases_the_next_without_reading_the_run(
    engine: Engine, names: Names, run_reads: list[int]
) -> None:
    run_id, claimed = _started_map(engine, names, "orders_continue")
    run_reads.clear()
    map_runs.apply(engine, names, _fail(claimed[0]))
    assert run_reads == []
    assert _items(engine, run_id)[5] == "pending"
    assert _state(engine, run_id, "reserve") == "waiting"


def test_an_item_failing_under_fail_fast_ends_the_map_from_the_runs_rows(
    engine: Engine, names: Names, run_reads: list[int]
) -> None:
    run_id, claimed = _started_map(engine, names, "orders")
    run_reads.clear()
    map_runs.apply(engine, names, _fail(claimed[0]))
    assert run_reads != []  # the map ends: decided from the run's rows
    assert _state(engine, run_id, "reserve") == "error"
    assert [_items(engine, run_id)[i] for i in range(5, LINES)] == ["skipped"] * (LINES - 5)
