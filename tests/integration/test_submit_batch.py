"""Set-based submission (store.submit_many): a batch of runs in one statement, and the
submitter's batches with their fallback to one submission at a time (store.submit.record_runs).
That both paths write the same rows: test_paths_agree.py."""

from __future__ import annotations

import json
import logging
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, event, func, select

from sasflow import Registry, Step, StepContext, Workflow, submit_run
from sasflow.commands import NewRun
from sasflow.store.notify import channel
from sasflow.store.runs import submit_many
from sasflow.store.schema import events, runs, steps
from sasflow.submitter import Submitter
from sasflow.transport.base import Outgoing
from sasflow.transport.topology import Names, declare_common
from tests import harness
from tests.apps import basic

pytestmark = pytest.mark.integration


def _prepared(workflow: str, key: str, data: dict[str, Any], **extra: Any) -> submit_many.Prepared:
    return submit_many.prepare(basic.registry, NewRun(workflow, data, key=key, **extra))


def _rows(engine: Engine, table: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(table).order_by(table.c.id)).all())


def test_one_statement_records_runs_steps_events_and_one_wakeup(
    engine: Engine, database_url: str
) -> None:
    """Runs, step records (first steps with the run's input, fresh idempotency keys, in
    definition order) and the `pending` event of each run; one NOTIFY at commit."""
    listener = psycopg.connect(database_url.replace("+psycopg", ""), autocommit=True)
    try:
        listener.execute(f'LISTEN "{channel("t")}"')
        with engine.begin() as conn:
            results = submit_many.insert(
                conn,
                [
                    _prepared("pipeline", "a", {"text": "a"}, priority=5, pool="p"),
                    _prepared("diamond", "b", {"text": "b"}, reply_to="back"),
                ],
                actor="tester",
                namespace="t",
            )
        woken = list(listener.notifies(timeout=1, stop_after=2))
    finally:
        listener.close()
    assert [(r.business_key, r.created) for r in results] == [("a", True), ("b", True)]
    assert len(woken) == 1
    run_rows = _rows(engine, runs)
    assert [(r.workflow, r.priority, r.pool, r.reply_to) for r in run_rows] == [
        ("pipeline", 5, "p", None),
        ("diamond", 0, None, "back"),
    ]
    step_rows = _rows(engine, steps)
    first = [s for s in step_rows if s.run_id == results[0].run_id]
    assert [(s.name, s.state, s.input, s.priority, s.pool) for s in first] == [
        ("a", "pending", {"text": "a"}, 5, "p"),
        ("b", "waiting", None, 5, "p"),
    ]
    assert all(len(s.idempotency_key) == 32 for s in step_rows)
    assert len({s.idempotency_key for s in step_rows}) == len(step_rows)
    diamond = basic.registry.workflow("diamond")
    second = [s.name for s in step_rows if s.run_id == results[1].run_id]
    assert second == list(diamond.order)
    event_rows = _rows(engine, events)
    assert [(e.run_id, e.entity, e.to_state, e.reason, e.detail, e.actor) for e in event_rows] == [
        (results[0].run_id, "run", "pending", "received", {"priority": 5}, "tester"),
        (results[1].run_id, "run", "pending", "received", {"priority": 0}, "tester"),
    ]
    assert not any(e.published for e in event_rows)


def test_duplicates_in_a_batch_and_across_batches_are_the_existing_run(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A key repeated inside a batch, or already recorded, maps to the one run (created
    False), with a warning when the input differs; nothing is woken for duplicates alone."""
    with engine.begin() as conn:
        [old] = submit_many.insert(
            conn, [_prepared("pipeline", "old", {"text": "o"})], actor="t", namespace="t"
        )
    with caplog.at_level(logging.WARNING), engine.begin() as conn:
        results = submit_many.insert(
            conn,
            [
                _prepared("pipeline", "new", {"text": "n"}),
                _prepared("pipeline", "old", {"text": "o"}),
                _prepared("pipeline", "new", {"text": "different"}),
                _prepared("diamond", "new", {"text": "n"}),
            ],
            actor="t",
            namespace="t",
        )
    assert [(r.business_key, r.created) for r in results] == [
        ("new", True),
        ("old", False),
        ("new", False),
        ("new", True),
    ]
    assert results[1].run_id == old.run_id
    assert results[2].run_id == results[0].run_id
    assert results[3].run_id != results[0].run_id
    assert len(_rows(engine, runs)) == 3
    assert len(_rows(engine, events)) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "different input" in warnings[0]


def _builds_its_own_input(ctx: StepContext) -> Any:
    return {"run": ctx.run_id, "key": ctx.business_key}


custom = Workflow("custom", [Step("a", "echo", "upper", input=_builds_its_own_input)])
registry = Registry([*basic.registry.workflows, custom], [basic.echo])


def test_a_first_step_that_builds_its_input_takes_the_portable_path(engine: Engine) -> None:
    """The input builder sees the run id, which only exists once the run is inserted."""
    count = 0

    def counted(*_args: Any) -> None:
        nonlocal count
        count += 1

    with engine.begin() as conn:
        assert not submit_many.one_statement(conn, custom)
        assert submit_many.one_statement(conn, basic.registry.workflow("pipeline"))
        event.listen(engine, "before_cursor_execute", counted)
        try:
            result = submit_run(conn, registry, "custom", {}, key="c", namespace="t")
            portable = count
            submit_run(conn, registry, "pipeline", {"text": "x"}, key="p", namespace="t")
        finally:
            event.remove(engine, "before_cursor_execute", counted)
    assert (portable, count - portable) == (4, 1)
    [step] = [s for s in _rows(engine, steps) if s.run_id == result.run_id]
    assert step.input == {"run": result.run_id, "key": "c"}


# ----------------------------------------------------------------------------- the submitter


def _publish(names: Names, *bodies: dict[str, Any] | bytes) -> None:
    """Queue the submissions on RabbitMQ before the submitter starts: its first batch (the
    prefetch's worth it is handed at once) holds them all, or nearly; every assertion below
    holds however the broker splits them into batches."""
    transport = harness.transport("app")
    transport.connect()
    try:
        declare_common(transport, names)
        for body in bodies:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            results = transport.publish_many([Outgoing("", names.submit, data)])
            assert results == [None]
    finally:
        transport.close()


def _serve(engine: Engine, names: Names, until: int) -> Submitter:
    """Run a submitter over what is queued until `until` submissions are answered."""
    role = harness.submitter(engine, registry, names)
    with harness.running(role):
        harness.wait_for(
            lambda: role.stats.created + role.stats.duplicates + role.stats.dead_lettered >= until,
            what="submissions answered",
        )
    return role


def test_submitter_batch_with_a_bad_submission_and_duplicates(engine: Engine, names: Names) -> None:
    """One batch: the good runs recorded, the duplicate answered, the unparsable and the
    unknown workflow dead-lettered with their reasons."""
    with engine.begin() as conn:
        submit_run(conn, registry, "pipeline", {"text": "x"}, key="before", namespace="t")
    _publish(
        names,
        {"workflow": "pipeline", "key": "k1", "input": {"text": "a"}},
        b"{not json",
        {"workflow": "pipeline", "key": "k1", "input": {"text": "a"}},
        {"workflow": "ghost"},
        {"workflow": "pipeline", "key": "before", "input": {"text": "x"}},
        {"workflow": "custom", "key": "k2"},
        {"workflow": "diamond", "key": "k3", "input": {"text": "b"}},
    )
    role = _serve(engine, names, 7)
    assert (role.stats.created, role.stats.duplicates, role.stats.dead_lettered) == (3, 2, 2)
    keys = sorted(r.business_key for r in _rows(engine, runs))
    assert keys == ["before", "k1", "k2", "k3"]
    reasons = sorted(str(d["reason"]) for d in harness.dead_letters(names, 2))
    assert any("ghost" in r for r in reasons)


def test_submitter_batch_the_database_refuses_falls_back_to_one_at_a_time(
    engine: Engine,
    names: Names,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A key the database cannot store (a NUL character) fails the batch's statement: the
    batch is recorded again one submission at a time, and only that one is dead-lettered."""
    _publish(
        names,
        {"workflow": "pipeline", "key": "good-1", "input": {"text": "a"}},
        {"workflow": "pipeline", "key": "bad\u0000key", "input": {"text": "b"}},
        {"workflow": "pipeline", "key": "good-2", "input": {"text": "c"}},
    )
    with caplog.at_level(logging.INFO, logger="sasflow.submitter"):
        role = _serve(engine, names, 3)
    assert (role.stats.created, role.stats.duplicates, role.stats.dead_lettered) == (2, 0, 1)
    assert any("batch refused" in r.getMessage() for r in caplog.records)
    assert sorted(r.business_key for r in _rows(engine, runs)) == ["good-1", "good-2"]
    (dead,) = harness.dead_letters(names, 1)
    assert "database rejected" in str(dead["reason"])
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(steps)).scalar_one() == 4
