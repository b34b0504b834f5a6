"""The mixed pair: the SQLite state store with real RabbitMQ. Scheduler, agent and supervisor
run the basic app's workflows to completion, the supervisor recovering a step a dead scheduler
held, with no LISTEN/NOTIFY (the scheduler's short rescan wakes it)."""

from __future__ import annotations

import json
import threading

import pytest
from sqlalchemy import Engine, func, select, update

from sasflow.commands import NewRun
from sasflow.store.db import transaction
from sasflow.store.runs.submit import submit
from sasflow.store.schema import events, runs, steps
from sasflow.store.sqltime import now, plus_seconds
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration


def _submit(engine: Engine, names: Names, workflow: str, key: str, text: str) -> int:
    with transaction(engine) as conn:
        return submit(
            conn,
            basic.registry,
            NewRun(workflow=workflow, key=key, input={"text": text}),
            namespace=names.namespace,
            actor="test",
        ).run_id


def test_scheduler_agent_and_supervisor_complete_runs_on_sqlite_and_rabbitmq(
    sqlite_engine: Engine,
    sqlite_url: str,
    names: Names,
) -> None:
    pipelines = [_submit(sqlite_engine, names, "pipeline", f"p{i}", f"text-{i}") for i in range(20)]
    diamond = _submit(sqlite_engine, names, "diamond", "d1", "hi")
    orphan = _submit(sqlite_engine, names, "pipeline", "orphan", "lost")
    with transaction(sqlite_engine) as conn:  # claimed by a scheduler that then died
        conn.execute(
            update(steps)
            .where(steps.c.run_id == orphan, steps.c.name == "a")
            .values(
                state="processing",
                attempt=1,
                locked_by="dead-scheduler",
                complete_by=plus_seconds(now(), -1),
            )
        )
        conn.execute(update(runs).where(runs.c.id == orphan).values(state="running"))
    scheduler = harness.scheduler(sqlite_engine, sqlite_url, basic.registry, names)
    supervisor = Supervisor(
        sqlite_engine,
        names,
        transport=harness.transport("supervisor"),
        options=SupervisorOptions(interval=0.2),
    )
    threads: set[str] = set()
    try:
        with harness.running(scheduler, harness.agent(basic.echo, names), supervisor):
            harness.wait_for(
                harness.all_runs_in(sqlite_engine, {"completed"}, 22),
                timeout=60,
                what="every run completes",
            )
            threads = {t.name for t in threading.enumerate()}
    finally:
        supervisor.close()
    assert f"{scheduler.id}-listen" not in threads, "a LISTEN thread was started on SQLite"
    with sqlite_engine.connect() as conn:
        outputs = dict(conn.execute(select(runs.c.id, runs.c.output)).all())
        orphan_a = conn.execute(
            select(steps).where(steps.c.run_id == orphan, steps.c.name == "a")
        ).one()
        expiry = conn.execute(
            select(events.c.reason, events.c.actor).where(
                events.c.step_id == orphan_a.id,
                events.c.from_state == "processing",
                events.c.to_state == "pending",
            )
        ).all()
    assert [outputs[r] for r in pipelines] == [
        {"b": {"length": len(f"text-{i}")}} for i in range(20)
    ]
    assert outputs[diamond] == {"end": {"joined": "HI-2"}}
    assert outputs[orphan] == {"b": {"length": 4}}
    # No agent ever started the orphan's attempt: the wait clock, no failure counted.
    assert (orphan_a.state, orphan_a.attempt, orphan_a.failure_count) == ("processed", 2, 0)
    assert [reason for reason, _ in expiry] == ["wait expired"]
    assert scheduler.stats.applied == 2 * 21 + 4


def test_the_submitter_dedupes_and_dead_letters_poison_on_sqlite(
    sqlite_engine: Engine,
    names: Names,
) -> None:
    """Submissions share one transaction with a savepoint each: a rejected one is rolled back
    alone (SAVEPOINT inside SQLite's BEGIN IMMEDIATE), the others commit, a duplicate key is
    the same run."""
    role = harness.submitter(sqlite_engine, basic.registry, names)
    good = json.dumps({"workflow": "pipeline", "key": "o-1", "input": {"text": "a"}}).encode()
    with harness.running(role):
        harness.wait_for(lambda: services.queue_exists(names.submit), what="submit queue")
        for body in (
            good,
            json.dumps({"workflow": "ghost"}).encode(),
            good,
            json.dumps({"workflow": "diamond", "key": "o-2", "input": {"text": "b"}}).encode(),
        ):
            harness.publish_raw(names.submit, body)
        harness.wait_for(
            lambda: role.stats.created == 2 and role.stats.duplicates == 1,
            what="two runs, one duplicate",
        )
        (dead,) = harness.dead_letters(names, 1)
    assert "unknown workflow 'ghost'" in str(dead["reason"])
    with sqlite_engine.connect() as conn:
        keys = sorted(conn.execute(select(runs.c.business_key)).scalars())
        step_count = conn.execute(select(func.count()).select_from(steps)).scalar_one()
    assert keys == ["o-1", "o-2"]
    assert step_count == 2 + 4
