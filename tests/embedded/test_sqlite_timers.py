"""Timer steps and `start_at` on the SQLite state store (with real RabbitMQ): the same SQL
time arithmetic as on PostgreSQL, on SQLite's text timestamps."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, func, select

from sasflow.commands import NewRun
from sasflow.store.db import transaction
from sasflow.store.runs.submit import submit
from sasflow.store.schema import events
from sasflow.transport.topology import Names
from tests import harness
from tests.integration.test_timers import SLEEP, _registry

pytestmark = pytest.mark.integration


def _claimed_at(engine: Engine, run_id: int, step: str) -> datetime:
    with engine.connect() as conn:
        found = conn.execute(
            select(func.min(events.c.created_at)).where(
                events.c.run_id == run_id, events.c.step == step, events.c.to_state == "processing"
            )
        ).scalar_one()
    assert isinstance(found, datetime)
    return found


def test_timers_and_start_at_on_sqlite(
    sqlite_engine: Engine, sqlite_url: str, names: Names
) -> None:
    registry, agent = _registry()
    # SQLite's clock is the machine's: the same clock as this process's here.
    wake_at = datetime.now().astimezone() + timedelta(seconds=SLEEP)
    with transaction(sqlite_engine) as conn:
        ids = [
            submit(conn, registry, new, namespace=names.namespace, actor="test").run_id
            for new in (
                NewRun(workflow="nap", key="n", input={}),
                NewRun(workflow="alarm", key="a", input={"wake_at": wake_at.isoformat()}),
                NewRun(workflow="later", key="l", input={}, start_at=wake_at),
            )
        ]
    with harness.running(
        harness.scheduler(sqlite_engine, sqlite_url, registry, names),
        harness.agent(agent, names),
    ):
        harness.wait_for(
            lambda: harness.run_states(sqlite_engine) == dict.fromkeys(ids, "completed"),
            timeout=20,
            what="the three runs end",
        )
    nap, alarm, later = ids
    assert (_claimed_at(sqlite_engine, nap, "b") - _claimed_at(sqlite_engine, nap, "a")) >= (
        timedelta(seconds=SLEEP)
    )
    assert _claimed_at(sqlite_engine, alarm, "b") >= wake_at
    assert _claimed_at(sqlite_engine, later, "a") >= wake_at
