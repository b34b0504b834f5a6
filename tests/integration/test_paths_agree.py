"""The PostgreSQL fast paths write what the portable paths write: submission (one statement
against a few per run), claim (one statement with data-modifying CTEs against a claim, a start
and an insert of events), apply (the `ok` outcomes of a batch in one statement) and the events
(COPY against INSERT). The portable paths run on the same database through an engine whose
capabilities are `portable()` (store.dialect.with_capabilities)."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import fields, replace
from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow import Backoff, Registry, Step, StepContext, StepPolicy, Workflow
from sasflow.commands import NewRun, StepOutcome, SubmitResult
from sasflow.states import ReplyStatus
from sasflow.store.dialect import Capabilities, capabilities, with_capabilities
from sasflow.store.runs import claim, deferred
from sasflow.store.runs.apply import apply_outcomes
from sasflow.store.runs.decide import Built, NeedsAdvance, decide, outputs_of
from sasflow.store.runs.submit import record_runs
from sasflow.store.schema import callbacks, events, runs, steps
from tests.apps import basic

pytestmark = pytest.mark.integration

everything = Workflow(
    "everything",
    [
        Step("first", "echo", "upper", compensate="length", pool="gpu"),
        Step(
            "second",
            "echo",
            "length",
            after=(),
            policy=StepPolicy(
                timeout=7.5,
                max_failures=9,
                backoff=Backoff(initial=0.5, multiplier=3.0, maximum=60.0),
                give_up_after=1234.0,
            ),
        ),
        Step("last", "echo", "join", after=("first", "second"), input=lambda c: c.outputs),
    ],
    version=3,
    on_failure="compensate",
)
registry = Registry([everything], [basic.echo])

RUNS = 10
"""Runs per path: a claim of their first steps records 30 events and their replies 20, past
events.COPY_FROM, so the events of both go in with COPY on the fast path."""

UUID4_HEX = re.compile(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}")
"""What step_rows.new_idempotency_key draws (and its SQL twin)."""

VOLATILE = {"id", "run_id", "step_id", "idempotency_key", "business_key"}
"""Columns that differ from run to run whatever the path (and every timestamp)."""


def _stable(row: Any) -> dict[str, Any]:
    return {
        k: v
        for k, v in row._asdict().items()
        if k not in VOLATILE and not isinstance(v, dt.datetime)
    }


def _recorded(engine: Engine, run_id: int) -> dict[str, Any]:
    """A run's row, its steps, its events and its callbacks, without what differs from run
    to run."""
    with engine.connect() as conn:

        def of(table: Any) -> list[dict[str, Any]]:
            rows = conn.execute(
                select(table).where(table.c.run_id == run_id).order_by(table.c.id)
            ).all()
            return [_stable(r) for r in rows]

        run = conn.execute(select(runs).where(runs.c.id == run_id)).one()
        return {
            "run": _stable(run),
            "steps": of(steps),
            "events": of(events),
            "callbacks": [(c["url"], c["state"]) for c in of(callbacks)],
        }


def _drive(bind: Engine, prefix: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Submit RUNS runs, claim and complete their steps until the runs end; their ids, and
    per claim the steps claimed and the outcomes dropped (a duplicate reply is sent for one
    step of each batch: applied one by one, after the batch, and dropped)."""
    new = NewRun(
        "everything",
        {"text": "x", "n": [1, 2.5, None]},
        priority=-3,
        reply_to="replies",
        submitted_by="token-a",
        callback_url="https://example.com/done",
        pool="big",
        trace_parent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    with bind.begin() as conn:
        answers = record_runs(
            conn,
            registry,
            [replace(new, key=f"{prefix}{i}") for i in range(RUNS)],
            namespace="t",
            actor="a",
        )
    run_ids = [a.run_id for a in answers if isinstance(a, SubmitResult) and a.created]
    assert len(run_ids) == RUNS
    rounds: list[tuple[int, int]] = []
    while True:
        with bind.begin() as conn:
            claimed = claim.claim_steps(conn, locked_by="s", batch=100)
        if not claimed:
            break
        outcomes = [
            StepOutcome(c.id, c.attempt, ReplyStatus.OK, output={"step": c.name}) for c in claimed
        ]
        outcomes.append(outcomes[0])
        with bind.begin() as conn:
            report = apply_outcomes(conn, registry, outcomes, namespace="t", actor="s")
        rounds.append((len(claimed), len(report.dropped)))
        _advance_marked(bind)
    return run_ids, rounds


def _advance_marked(bind: Engine) -> None:
    """What a scheduler's advance duty does for the runs the replies marked ("last" has an
    input builder): take them, build their inputs from the snapshots, advance them."""
    with bind.begin() as conn:
        taken = deferred.take(conn, (("everything", 3),), batch=100, hold_s=30.0)
    built: dict[int, Built] = {}
    for snapshot in taken:
        run = snapshot.run
        ctx = StepContext(run.input, outputs_of(snapshot.steps), run.id, run.business_key)
        for transition in decide(run, snapshot.steps, everything):
            if isinstance(transition, NeedsAdvance):
                inputs = {name: everything.step(name).input(ctx) for name in transition.steps}
                built[run.id] = Built(inputs)
    with bind.begin() as conn:
        deferred.advance(conn, registry, built, namespace="t", actor="s")


def test_fast_and_portable_paths_write_the_same_rows(engine: Engine) -> None:
    """Every column of the runs, their steps, their events and their callbacks, through
    submission, two claims and two reply batches: the same on both paths."""
    fast = capabilities(engine)
    assert fast == Capabilities(*[True] * len(fields(Capabilities)))
    portable = with_capabilities(engine, fast.portable())
    assert capabilities(portable) == fast.portable()
    assert capabilities(engine) == fast

    fast_runs, fast_rounds = _drive(engine, "fast-")
    portable_runs, portable_rounds = _drive(portable, "portable-")

    assert fast_rounds == portable_rounds == [(2 * RUNS, 1), (RUNS, 1)]
    for one, other in zip(fast_runs, portable_runs, strict=True):
        assert _recorded(engine, one) == _recorded(engine, other)
    done = _recorded(engine, fast_runs[0])
    assert done["run"]["state"] == "completed"
    assert [(s["name"], s["state"], s["pool"]) for s in done["steps"]] == [
        ("first", "processed", "gpu"),
        ("second", "processed", "big"),
        ("last", "processed", "big"),
    ]
    assert done["callbacks"] == [("https://example.com/done", "pending")]
    with engine.connect() as conn:
        keys = conn.execute(select(steps.c.idempotency_key)).scalars().all()
    assert len(keys) == 2 * 3 * RUNS
    assert all(UUID4_HEX.fullmatch(k) for k in keys), "both paths draw keys of one form"
