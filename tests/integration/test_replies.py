"""Replies are fenced by attempt: stale and duplicate replies are dropped; poison is
dead-lettered while the scheduler keeps serving."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, select, update

from sasflow import SubmitResult, submit_run
from sasflow.messages import ErrorInfo, Reply
from sasflow.scheduler import Scheduler
from sasflow.store.db import transaction
from sasflow.store.runs.apply import apply_outcomes
from sasflow.store.runs.claim import claim_steps
from sasflow.store.schema import events, runs, steps
from sasflow.transport.topology import SOURCE_HEADER, Names
from tests import harness
from tests.apps import basic

pytestmark = pytest.mark.integration


def _reclaim(engine: Engine, step_id: int) -> int:
    """Make a processing step pending again (as the supervisor does) and claim it anew."""
    with engine.begin() as conn:
        conn.execute(
            update(steps)
            .where(steps.c.id == step_id)
            .values(state="pending", locked_by=None, complete_by=None)
        )
    with transaction(engine) as conn:
        (claimed,) = claim_steps(conn, locked_by="s2", batch=1)
    assert claimed.id == step_id
    return claimed.attempt


def _apply(engine: Engine, reply: Reply, names: Names) -> int:
    with transaction(engine) as conn:
        return apply_outcomes(
            conn, basic.registry, [reply.outcome()], namespace=names.namespace, actor="test"
        ).applied


def test_late_reply_of_an_older_attempt_and_duplicate_reply_are_dropped(
    engine: Engine, names: Names
) -> None:
    with engine.begin() as conn:
        run = submit_run(
            conn, basic.registry, "pipeline", {"text": "x"}, key="k", namespace=names.namespace
        )
    with transaction(engine) as conn:
        (step,) = claim_steps(conn, locked_by="s1", batch=1)
    assert _reclaim(engine, step.id) == 2
    late = Reply(step_id=step.id, attempt=1, status="ok", output={"text": "LATE"})
    assert _apply(engine, late, names) == 0
    current = Reply(step_id=step.id, attempt=2, status="ok", output={"text": "X"})
    assert _apply(engine, current, names) == 1
    assert _apply(engine, current, names) == 0
    error_after = Reply(
        step_id=step.id, attempt=2, status="error", error=ErrorInfo(type="Boom", message="too late")
    )
    assert _apply(engine, error_after, names) == 0
    rows = {r.name: r for r in harness.step_rows(engine, run.run_id)}
    assert (rows["a"].state, rows["a"].output) == ("processed", {"text": "X"})
    # b's input has a builder of its own: left to a scheduler's advance duty, not built here.
    assert rows["b"].state == "waiting"
    with engine.connect() as conn:
        assert conn.execute(select(runs.c.advance_due).where(runs.c.id == run.run_id)).scalar_one()
    with engine.connect() as conn:
        processed = conn.execute(
            select(events.c.id).where(events.c.step_id == step.id, events.c.to_state == "processed")
        ).all()
    assert len(processed) == 1


def _pipeline_and_scheduler(
    engine: Engine, database_url: str, names: Names
) -> tuple[SubmitResult, Scheduler]:
    with engine.begin() as conn:
        run = submit_run(
            conn, basic.registry, "pipeline", {"text": "abc"}, key="k1", namespace=names.namespace
        )
    return run, harness.scheduler(engine, database_url, basic.registry, names)


def _first_dispatched(engine: Engine, role: Scheduler, run: SubmitResult) -> Any:
    """Wait until the scheduler dispatched step "a" (no agent runs: it stays processing)."""
    harness.wait_for(lambda: role.stats.dispatched == 1, what="first dispatch")
    (step,) = [r for r in harness.step_rows(engine, run.run_id) if r.name == "a"]
    return step


def test_scheduler_dead_letters_malformed_replies_drops_stale_ones_and_keeps_serving(
    engine: Engine, database_url: str, names: Names
) -> None:
    run, role = _pipeline_and_scheduler(engine, database_url, names)
    with harness.running(role):
        step = _first_dispatched(engine, role, run)
        harness.publish_raw(names.replies, b"\xff\xfe not json")
        harness.publish_raw(names.replies, b'{"step_id": 1, "attempt": 1, "status": "maybe"}')
        stale = Reply(step_id=step.id, attempt=7, status="ok", output={"text": "NO"})
        harness.publish_raw(names.replies, stale.encode())
        dead = harness.dead_letters(names, 2)
        harness.wait_for(lambda: role.stats.dropped == 1, what="stale reply dropped")
        good = Reply(step_id=step.id, attempt=1, status="ok", output={"text": "ABC"})
        harness.publish_raw(names.replies, good.encode())
        harness.publish_raw(names.replies, good.encode())
        harness.wait_for(
            lambda: role.stats.applied == 1 and role.stats.dropped == 2,
            what="good reply applied, duplicate dropped",
        )
    assert {d["headers"][SOURCE_HEADER] for d in dead} == {names.replies}
    reasons = " | ".join(str(d["reason"]) for d in dead)
    assert "not UTF-8 JSON" in reasons
    assert "status" in reasons
    rows = {r.name: r for r in harness.step_rows(engine, run.run_id)}
    assert rows["a"].output == {"text": "ABC"}
    assert rows["b"].state == "processing"  # dispatched after "a" (no agent runs in this test)


def test_a_reply_the_store_cannot_hold_fails_its_step_instead_of_stalling(
    engine: Engine, database_url: str, names: Names
) -> None:
    """A foreign agent replies `ok` with a NUL character in the output (valid JSON that jsonb
    refuses): the step goes to error with the database's reason and the run fails visibly."""
    run, role = _pipeline_and_scheduler(engine, database_url, names)
    with harness.running(role):
        step = _first_dispatched(engine, role, run)
        body = b'{"step_id": %d, "attempt": 1, "status": "ok", "output": "x\\u0000y"}' % step.id
        harness.publish_raw(names.replies, body)
        harness.wait_for(
            lambda: harness.run_states(engine) == {run.run_id: "error"}, what="run fails"
        )
    rows = {r.name: r for r in harness.step_rows(engine, run.run_id)}
    assert rows["a"].state == "error"
    assert rows["a"].error["type"] == "InvalidReplyError"
    assert "could not be stored" in rows["a"].error["message"]
    assert role.stats.dead_lettered == 0


def test_a_batch_of_ok_replies_is_fenced_per_step(engine: Engine, names: Names) -> None:
    """Applied together (one statement on PostgreSQL), `ok` replies are still fenced each by
    its own attempt: the current ones are applied with their outputs, a stale one is dropped,
    and a step's duplicate in the same batch is applied once."""
    with engine.begin() as conn:
        runs = [
            submit_run(
                conn, basic.registry, "pipeline", {"text": f"t{i}"}, namespace=names.namespace
            ).run_id
            for i in range(3)
        ]
    with transaction(engine) as conn:
        first, second, third = sorted(
            claim_steps(conn, locked_by="s1", batch=3), key=lambda s: s.id
        )
    replies = [
        Reply(step_id=first.id, attempt=1, status="ok", output={"text": "ONE"}),
        Reply(step_id=second.id, attempt=2, status="ok", output={"text": "STALE"}),
        Reply(step_id=third.id, attempt=1, status="ok", output={"text": "THREE"}),
        Reply(step_id=third.id, attempt=1, status="ok", output={"text": "THREE"}),
    ]
    with transaction(engine) as conn:
        report = apply_outcomes(
            conn,
            basic.registry,
            [r.outcome() for r in replies],
            namespace=names.namespace,
            actor="test",
        )
    assert (report.applied, len(report.dropped)) == (2, 2)
    states = [
        {r.name: (r.state, r.output) for r in harness.step_rows(engine, run)}["a"] for run in runs
    ]
    assert states == [
        ("processed", {"text": "ONE"}),
        ("processing", None),
        ("processed", {"text": "THREE"}),
    ]


def test_a_failed_reply_records_when_its_step_is_ready_again(engine: Engine, names: Names) -> None:
    """A `failed` reply below the threshold puts the step back to pending after a backoff;
    its event records the agent's error and that moment (`not_before`, the console's bar)."""
    with engine.begin() as conn:
        submit_run(
            conn, basic.registry, "pipeline", {"text": "x"}, key="nb", namespace=names.namespace
        )
    with transaction(engine) as conn:
        (step,) = claim_steps(conn, locked_by="s1", batch=1)
    failed = Reply(
        step_id=step.id, attempt=1, status="failed", error=ErrorInfo(type="Flaky", message="503")
    )
    assert _apply(engine, failed, names) == 1
    with engine.connect() as conn:
        ready_at = conn.execute(select(steps.c.not_before).where(steps.c.id == step.id)).scalar()
        detail = conn.execute(
            select(events.c.detail).where(
                events.c.step_id == step.id, events.c.from_state == "processing"
            )
        ).scalar_one()
    assert ready_at is not None
    assert detail == {
        "error": {"type": "Flaky", "message": "503"},
        "agent": None,
        "not_before": ready_at.isoformat(),
    }


def test_a_deferred_reply_records_when_its_step_is_ready_again(
    engine: Engine, names: Names
) -> None:
    """A `deferred` reply (an open breaker, `Defer`) parks the step without a failure; its
    event records the agent's error and when the step is ready again, as a failure's does."""
    with engine.begin() as conn:
        submit_run(
            conn, basic.registry, "pipeline", {"text": "x"}, key="nbd", namespace=names.namespace
        )
    with transaction(engine) as conn:
        (step,) = claim_steps(conn, locked_by="s1", batch=1)
    deferred = Reply(
        step_id=step.id,
        attempt=1,
        status="deferred",
        defer_seconds=30,
        error=ErrorInfo(type="BreakerOpen", message="payments is open"),
    )
    assert _apply(engine, deferred, names) == 1
    with engine.connect() as conn:
        row = conn.execute(
            select(steps.c.not_before, steps.c.state, steps.c.failure_count).where(
                steps.c.id == step.id
            )
        ).one()
        detail = conn.execute(
            select(events.c.detail).where(
                events.c.step_id == step.id, events.c.from_state == "processing"
            )
        ).scalar_one()
    assert (row.state, row.failure_count) == ("pending", 0)
    assert detail == {
        "error": {"type": "BreakerOpen", "message": "payments is open"},
        "agent": None,
        "not_before": row.not_before.isoformat(),
    }
