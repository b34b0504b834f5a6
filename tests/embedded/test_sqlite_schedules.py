"""Schedules on the embedded default: SQLite and the in-process bus, every role a thread of one
process (what `sasflow run` starts). Two schedulers share the schedules with no LISTEN/NOTIFY
(their rescan is the wake-up); each tick fires once and its run completes; an operator's
trigger fires once more."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, func, select

from sasflow.local import LocalOptions, LocalRunner, add_roles
from sasflow.ops import schedules as schedule_ops
from sasflow.registry import Registry
from sasflow.scheduler import SchedulerOptions
from sasflow.scheduler.cluster.member import ClusterOptions
from sasflow.schedules.definition import Schedule
from sasflow.store.db import transaction
from sasflow.store.schema import runs, schedule_ticks, schedulers, schedules
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import basic


@pytest.fixture
def registry() -> Registry:
    return Registry(
        [basic.pipeline],
        [basic.echo],
        schedules=[
            Schedule("every-second", "pipeline", every=1, input={"text": "tick"}),
            Schedule("nightly", "pipeline", cron="0 2 * * *", timezone="Europe/Paris"),
        ],
    )


def test_schedules_fire_once_per_tick_on_sqlite_with_two_schedulers(
    sqlite_engine: Engine, sqlite_url: str, registry: Registry
) -> None:
    broker = MemoryBroker()
    names = Names("embedded")
    runner = LocalRunner()
    add_roles(
        runner,
        sqlite_engine,
        lambda role: MemoryTransport(broker, process_name=role),
        registry,
        names,
        database_url=sqlite_url,
        options=LocalOptions(
            schedulers=2, scheduler=SchedulerOptions(cluster=ClusterOptions(lease_ttl=2))
        ),
    )
    with runner.running():
        harness.wait_for(lambda: _count(sqlite_engine, schedule_ticks) >= 3, timeout=20)
        harness.wait_for(
            lambda: _count(sqlite_engine, schedulers) == 2, timeout=10, what="both registered"
        )
        with transaction(sqlite_engine) as conn:
            fired = schedule_ops.trigger(
                conn, "nightly", registry, actor="test", reason=None, namespace=names.namespace
            )
        assert fired["run_id"] is not None
        harness.wait_for(
            lambda: _completed(sqlite_engine) >= 4, timeout=30, what="the ticks' runs complete"
        )
    with sqlite_engine.connect() as conn:
        owners = conn.execute(select(schedules.c.name, schedules.c.owner)).all()
        keys = conn.execute(select(runs.c.business_key)).scalars().all()
        ticks = conn.execute(select(schedule_ticks.c.run_id)).scalars().all()
    assert all(owner is None for _, owner in owners), "stopping schedulers release what they hold"
    assert len(keys) == len(set(keys)) == len(ticks)
    assert all(key.startswith("schedule:") for key in keys)


def _count(engine: Engine, table: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())  # type: ignore[arg-type]


def _completed(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(select(func.count()).where(runs.c.state == "completed")).scalar_one()
        )
