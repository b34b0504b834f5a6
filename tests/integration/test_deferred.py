"""The runs left to the schedulers' advance duty, at the store (store.runs.deferred): marked by
a reply, taken only by a scheduler with their version, held while it builds (and free again
when its hold lapses: a scheduler that died), advanced with what was built."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select

from sasflow import submit_run
from sasflow.commands import StepOutcome
from sasflow.states import ReplyStatus
from sasflow.store.runs import claim, deferred
from sasflow.store.runs.apply import apply_outcomes
from sasflow.store.runs.decide import Built
from sasflow.store.schema import runs
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import basic

pytestmark = pytest.mark.integration

PIPELINE = (("pipeline", 1),)


def _marked_run(engine: Engine, names: Names) -> int:
    """A pipeline run whose step a was processed: step b (its own builder) waits, marked."""
    with engine.begin() as conn:
        run = submit_run(
            conn, basic.registry, "pipeline", {"text": "abc"}, key="k", namespace=names.namespace
        )
    with engine.begin() as conn:
        (step,) = claim.claim_steps(conn, locked_by="s", batch=10)
        outcome = StepOutcome(step.id, step.attempt, ReplyStatus.OK, output={"text": "ABC"})
        report = apply_outcomes(conn, basic.registry, [outcome], namespace="t", actor="s")
    assert (report.ready, report.deferred) == (0, 1)
    return run.run_id


def _take(engine: Engine, loaded: tuple[tuple[str, int], ...], hold_s: float) -> list[int]:
    with engine.begin() as conn:
        return [s.run.id for s in deferred.take(conn, loaded, batch=10, hold_s=hold_s)]


def test_a_marked_run_is_held_by_one_scheduler_until_its_hold_lapses(
    engine: Engine, names: Names
) -> None:
    run_id = _marked_run(engine, names)
    assert _take(engine, (("pipeline", 2), ("diamond", 1)), 30.0) == []  # not its version
    assert _take(engine, PIPELINE, 0.3) == [run_id]
    assert _take(engine, PIPELINE, 30.0) == []  # held
    harness.wait_for(lambda: _take(engine, PIPELINE, 30.0) == [run_id], what="the hold lapsed")

    with engine.begin() as conn:
        report = deferred.advance(
            conn,
            basic.registry,
            {run_id: Built(inputs={"b": {"text": "ABC"}})},
            namespace=names.namespace,
            actor="s2",
        )
    assert (report.ready, report.deferred) == (1, 0)
    b = next(r for r in harness.step_rows(engine, run_id) if r.name == "b")
    assert (b.state, b.input) == ("pending", {"text": "ABC"})
    with engine.connect() as conn:
        mark = conn.execute(select(runs.c.advance_due).where(runs.c.id == run_id)).scalar_one()
    assert mark is None
    assert _take(engine, PIPELINE, 30.0) == []
