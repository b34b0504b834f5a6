"""Consumed inbound events are deleted with their run by the runs' retention, on PostgreSQL:
an event a pruned run's wait consumed goes (archived with the run, counted by the pass), one a
kept run consumed stays and still deduplicates its id, and unmatched events keep their own
expiry (the prune never touches them). After its run is pruned, a duplicate is stored anew."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, func, select, text, update

from sasflow import Registry, Step, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.cli.main import cli
from sasflow.ops.retention import PruneOptions, RetentionPolicy, prune
from sasflow.store.db import transaction
from sasflow.store.inbound import ingest, match
from sasflow.store.runs.advance import advance_runs
from sasflow.store.runs.events import record as record_events
from sasflow.store.schema import audit, inbound_events, runs, steps
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names

pytestmark = pytest.mark.integration

POLICY = RetentionPolicy.of(completed_days=30, failed_days=90)
AGENT = Agent("work")


@AGENT.handler("do")
def _do(call: Call) -> None:
    return None


REGISTRY = Registry(
    [
        Workflow(
            "order",
            [
                Step("placed", "work", "do"),
                Step.wait_for(
                    "paid", event="payment_confirmed", match="input.order_id", timeout=3600
                ),
            ],
        )
    ],
    [AGENT],
)


def _send(engine: Engine, names: Names, order: str, event_id: str, **extra: Any) -> ingest.Stored:
    body = {"name": "payment_confirmed", "correlation": order, "id": event_id, **extra}
    with transaction(engine) as conn:
        return ingest.store_event(
            conn,
            ingest.InboundEvent.from_json(body),
            source="api",
            namespace=names.namespace,
            actor="test",
            registry=REGISTRY,
        )


def _paid_run(engine: Engine, names: Names, order: str, days_ago: float) -> int:
    """A run whose wait consumed the event `evt-<order>`, then finished `days_ago` days ago by
    the database clock."""
    with transaction(engine) as conn:
        run_id = submit_run(
            conn, REGISTRY, "order", {"order_id": order}, key=order, namespace=names.namespace
        ).run_id
    stored = _send(engine, names, order, f"evt-{order}")  # stored first
    with transaction(engine) as conn:  # `placed` done: the wait opens and takes it
        conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.name == "placed")
            .values(state="processed", output={})
        )
        record_events(conn, advance_runs(conn, REGISTRY, [run_id], actor="test").events)
    with engine.connect() as conn:
        consumed = conn.execute(
            select(inbound_events.c.consumed_step_id).where(inbound_events.c.id == stored.id)
        ).scalar_one()
    assert consumed is not None
    with engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(
                state="completed",
                finished_at=func.now() - text(f"interval '{days_ago * 86400} seconds'"),
            )
        )
    return run_id


def _stored_ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(inbound_events.c.event_id)).scalars())


@pytest.fixture
def history(engine: Engine, names: Names) -> dict[str, int]:
    made = {
        "old": _paid_run(engine, names, "old", 40),
        "recent": _paid_run(engine, names, "new", 10),
    }
    _send(engine, names, "nobody", "evt-waiting")  # unmatched, 7 days to go
    _send(engine, names, "nobody", "evt-expired", retention=0.001)  # unmatched, expired
    return made


def test_prune_deletes_the_events_its_runs_consumed_and_nothing_else(
    engine: Engine, names: Names, history: dict[str, int], tmp_path: Path
) -> None:
    archive = tmp_path / "pruned.jsonl"
    with archive.open("a", encoding="utf-8") as export:
        done = prune(
            engine,
            POLICY,
            actor="tester",
            reason="test",
            options=PruneOptions(batch=1),
            export=export,
        )
    assert (done.run_ids, done.inbound_pruned) == ([history["old"]], 1)
    # The kept run's event stays, and both unmatched ones: their expiry is their own.
    assert _stored_ids(engine) == {"evt-new", "evt-waiting", "evt-expired"}
    with engine.connect() as conn:
        row = conn.execute(select(audit)).one()
    assert (row.detail["pruned"], row.detail["inbound_events"]) == (1, 1)
    [line] = [json.loads(x) for x in archive.read_text(encoding="utf-8").splitlines()]
    assert [e["event_id"] for e in line["inbound_events"]] == ["evt-old"]

    with transaction(engine) as conn:
        assert match.expire(conn, batch=10) == 1  # the unmatched rule, unchanged
    assert _stored_ids(engine) == {"evt-new", "evt-waiting"}

    # While its run is kept, an event's id is deduplicated; once pruned, it is stored anew.
    again = _send(engine, names, "new", "evt-new")
    assert (again.created, again.run_id) == (False, history["recent"])
    anew = _send(engine, names, "old", "evt-old")
    assert (anew.created, anew.step_id) == (True, None)


def test_the_supervisor_and_db_prune_count_the_consumed_events_they_deleted(
    database_url: str, engine: Engine, names: Names, history: dict[str, int]
) -> None:
    supervisor = Supervisor(engine, names, options=SupervisorOptions(retention=POLICY))
    report = supervisor.sweep_once()
    assert report is not None
    assert (report.pruned, report.inbound_pruned) == (1, 1)
    assert "inbound_pruned=1" in report.summary()
    assert _stored_ids(engine) == {"evt-new", "evt-waiting", "evt-expired"}

    env = {"SASFLOW_DATABASE_URL": database_url, "SASFLOW_NAMESPACE": names.namespace}
    args = ["db", "prune", "--older-than", "5d", "--state", "completed", "--yes", "-o", "json"]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    done = json.loads(result.output)
    assert (done["run_ids"], done["inbound_events"]) == ([history["recent"]], 1)
    assert _stored_ids(engine) == {"evt-waiting", "evt-expired"}
