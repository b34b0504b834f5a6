"""Faults the core must survive: a scheduler killed mid-batch, RabbitMQ and PostgreSQL
restarted mid-run.

The restarts happen to instances of this module's own (`tests/private_services.py`: free
ports, their own data directories, started once for the module and removed at its end), never
to the machine's services, whose other sessions a restart would end."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow import submit_run
from sasflow.store.cluster import fleet
from sasflow.store.db import make_engine, transaction
from sasflow.store.schema import alerts, events, runs, steps
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names
from tests import harness, private_services, services
from tests.acceptance.processes import Processes, processes
from tests.apps import basic, flow
from tests.chaos.instances import RabbitInstance
from tests.private_services import PrivatePostgres

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]


def _submit(engine: Engine, namespace: str, count: int, delay: float, prefix: str) -> None:
    with engine.begin() as conn:
        for i in range(count):
            submit_run(
                conn,
                basic.registry,
                "sleepy",
                {"delay": delay},
                key=f"{prefix}{i}",
                namespace=namespace,
            )


def test_scheduler_killed_mid_batch_loses_nothing(
    engine: Engine, names: Names, procs: Processes
) -> None:
    """SIGKILL a scheduler while it holds in-flight steps: the other scheduler applies the
    replies of the steps it dispatched; any step it claimed but never dispatched stays
    `processing` under its name for the supervisor; nothing is lost or duplicated; a restarted
    scheduler serves new work."""
    victim = procs.start("scheduler-1", "scheduler", "--batch", "10")
    procs.start("scheduler-2", "scheduler", "--batch", "10")
    procs.start("agent", "agent", "echo", "--concurrency", "16")
    procs.wait_ready("scheduler-1", "scheduler-2", "agent")
    _submit(engine, names.namespace, 80, delay=0.3, prefix="r")
    marker = f":{victim.pid}:"

    def victim_holds_steps() -> bool:
        with engine.connect() as conn:
            held = conn.execute(
                select(steps.c.id).where(
                    steps.c.state == "processing", steps.c.locked_by.contains(marker)
                )
            ).all()
        # More than one batch: its first batch was published before it claimed the next.
        return len(held) > 10

    harness.wait_for(victim_holds_steps, timeout=30, interval=0.01, what="victim holds steps")
    procs.signal("scheduler-1", signal.SIGKILL)
    assert procs.wait("scheduler-1") == -signal.SIGKILL

    def settled() -> bool:
        states = harness.run_states(engine)
        if len(states) != 80:
            return False
        with engine.connect() as conn:
            busy = (
                conn.execute(
                    select(steps.c.locked_by).where(steps.c.state.in_(("pending", "processing")))
                )
                .scalars()
                .all()
            )
        # Settled: the only steps left in flight are the dead scheduler's undispatched ones.
        return all(marker in (holder or "") for holder in busy)

    harness.wait_for(settled, timeout=120, interval=0.2, what="the survivor settles")
    with engine.connect() as conn:
        run_rows = conn.execute(select(runs.c.id, runs.c.state)).all()
        step_list = conn.execute(
            select(steps.c.id, steps.c.run_id, steps.c.state, steps.c.locked_by, steps.c.attempt)
        ).all()
        dispatch = dict(
            conn.execute(
                select(events.c.step_id, events.c.actor).where(
                    events.c.from_state == "pending", events.c.to_state == "processing"
                )  # the claims (an agent's `started` is a processing -> processing event)
            ).all()
        )
        applied = dict(
            conn.execute(
                select(events.c.step_id, events.c.actor).where(events.c.to_state == "processed")
            ).all()
        )
    assert {state for _, state in run_rows} <= {"running", "completed"}
    stranded = [s for s in step_list if s.state == "processing"]
    assert all(marker in s.locked_by for s in stranded)
    assert {s.run_id for s in stranded} == {r.id for r in run_rows if r.state == "running"}
    assert {s.attempt for s in step_list if s.state != "waiting"} == {1}
    handed_over = [
        sid
        for sid, actor in dispatch.items()
        if marker in actor and sid in applied and marker not in applied[sid]
    ]
    assert handed_over, "no reply of the killed scheduler's dispatches was applied by the other"
    print(
        f"\n[acceptance] killed scheduler: {len(handed_over)} of its dispatched steps were "
        f"completed through the survivor; {len(stranded)} left processing for the supervisor"
    )
    procs.start("scheduler-1b", "scheduler")
    _submit(engine, names.namespace, 5, delay=0, prefix="after")
    harness.wait_for(
        lambda: (
            sum(1 for s in harness.run_states(engine).values() if s == "completed")
            >= len(run_rows) - len(stranded) + 5
        ),
        timeout=60,
        what="new runs complete after the restart",
    )
    with engine.connect() as conn:
        still = conn.execute(select(steps.c.id).where(steps.c.state == "processing")).all()
    assert len(still) == len(stranded), "a new incarnation took over another's claimed steps"
    procs.assert_alive_except("scheduler-1")


def _start_system_with_work_in_flight(engine: Engine, procs: Processes) -> None:
    """Submitter, two schedulers and an agent; 60 two-step runs submitted, some completed."""
    procs.start("submitter", "submitter")
    procs.start("scheduler-1", "scheduler")
    procs.start("scheduler-2", "scheduler")
    procs.start("agent", "agent", "echo", "--concurrency", "8")
    procs.wait_ready("submitter", "scheduler-1", "scheduler-2", "agent")
    _submit(engine, procs.env["SASFLOW_NAMESPACE"], 60, delay=0.1, prefix="before")
    harness.wait_for(
        lambda: "completed" in harness.run_states(engine).values(),
        timeout=30,
        what="work in flight",
    )


@pytest.fixture(scope="module")
def own_rabbitmq() -> Iterator[RabbitInstance]:
    """This module's RabbitMQ node: restarted by its tests, removed at the module's end."""
    with private_services.rabbitmq() as rabbit:
        yield rabbit


@pytest.fixture
def procs_on_own_broker(
    tmp_path: Path, database_url: str, own_rabbitmq: RabbitInstance
) -> Iterator[Processes]:
    """The test's processes on its own database (the shared server, untouched) and the
    module's RabbitMQ, under a namespace of their own there."""
    with processes(
        tmp_path,
        database_url=database_url,
        namespace=services.unique("sftest"),
        broker_url=own_rabbitmq.url,
    ) as procs:
        yield procs


def test_rabbitmq_restart_during_a_run_processes_reconnect_and_runs_complete(
    engine: Engine, procs_on_own_broker: Processes, own_rabbitmq: RabbitInstance
) -> None:
    procs = procs_on_own_broker
    _start_system_with_work_in_flight(engine, procs)
    own_rabbitmq.stop_app()
    time.sleep(3)
    _submit(engine, procs.env["SASFLOW_NAMESPACE"], 20, delay=0.1, prefix="during")
    own_rabbitmq.start_app()
    submitted = procs.run(
        "submit", "sleepy", "--input", '{"delay": 0}', "--key", "via-broker", "--via-broker"
    )
    assert submitted.returncode == 0, submitted.stderr
    harness.wait_for(
        harness.all_runs_in(engine, {"completed"}, 81),
        timeout=120,
        interval=0.2,
        what="every run completes after the broker came back",
    )
    procs.assert_alive()
    with engine.connect() as conn:
        stuck = conn.execute(select(steps.c.id).where(steps.c.state != "processed")).all()
    assert stuck == []
    assert "reconnecting" in procs.log("scheduler-1") + procs.log("scheduler-2")


def test_a_broker_outage_is_one_alert_and_agents_are_timed_from_its_end(
    engine: Engine, own_rabbitmq: RabbitInstance
) -> None:
    """The module's broker stopped while runs wait for two agents nobody hears of any more:
    the supervisor raises one `broker_outage` naming both, no `agent_outage`; the broker back,
    the outage is resolved and the agents get `outage_after` from that moment before each is
    called out (they never came back: one `agent_outage` each, then)."""
    names = Names(services.unique("sftest"))
    with transaction(engine) as conn:
        fleet.record_heartbeats(conn, [_beat("pay"), _beat("other")])
    harness.submit(engine, flow.registry, names, "charge", key="c", run_input={})
    harness.submit(engine, flow.registry, names, "other", key="o", run_input={})
    supervisor = Supervisor(
        engine,
        names,
        transport=RabbitMQTransport(own_rabbitmq.url, process_name="test-supervisor"),
        options=SupervisorOptions(interval=0.1, outage_after=1.5),
    )
    try:
        assert supervisor.sweep_once() is not None, "the broker answers: nothing to say yet"
        own_rabbitmq.stop_app()
        try:
            harness.wait_for(
                lambda: bool(_sweep_alerts(supervisor)), timeout=30, what="the broker outage"
            )
            for _ in range(3):
                assert _sweep_alerts(supervisor) == [], "one alert for the whole outage"
        finally:
            own_rabbitmq.start_app()
        (outage,) = _outage_alerts(engine)
        assert (outage["kind"], outage["acknowledged"]) == ("broker_outage", False)
        assert outage["detail"]["agents"] == {"other": 1, "pay": 1}
        assert "Agent outages are not raised separately" in outage["message"]

        harness.wait_for(
            lambda: _outage_alerts(engine)[0]["acknowledged"] or not supervisor.sweep_once(),
            timeout=60,
            what="the broker outage resolved once the broker answers",
        )
        (resolved,) = _outage_alerts(engine)
        back_at = resolved["detail"]["back_at"]
        assert str(resolved["acknowledge_reason"]).startswith("the broker answers again")
        assert _sweep_alerts(supervisor) == [], "agents get outage_after to come back"
        time.sleep(1.6)
        assert len(_sweep_alerts(supervisor)) == 2
        agents = _outage_alerts(engine)[1:]
        assert sorted(a["dedup_key"] for a in agents) == [
            "agent_outage:other",
            "agent_outage:pay",
        ]
        assert {a["detail"]["since"] for a in agents} == {back_at}, "timed from its end"
    finally:
        supervisor.close()


def _beat(agent: str) -> fleet.InstanceReport:
    return fleet.InstanceReport(
        instance_id=f"{agent}-1",
        agent=agent,
        hostname="host",
        pid=1,
        version="1",
        concurrency=1,
        in_flight=0,
        breakers={},
        interval_s=0.2,
        seq=1,
    )


def _sweep_alerts(supervisor: Supervisor) -> list[int]:
    report = supervisor.sweep_once()
    assert report is not None
    return report.alerts


def _outage_alerts(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        query = (
            select(alerts)
            .where(alerts.c.kind.in_(("broker_outage", "agent_outage")))
            .order_by(alerts.c.id)
        )
        return [dict(r._mapping) for r in conn.execute(query)]


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PrivatePostgres]:
    """This module's PostgreSQL: restarted by its tests, removed at the module's end."""
    with private_services.postgres() as postgres:
        yield postgres


@pytest.fixture
def own_database_url(own_postgres: PrivatePostgres) -> str:
    """The test's database on the module's PostgreSQL, as the runtime role."""
    return own_postgres.new_database()


@pytest.fixture
def own_engine(own_database_url: str) -> Iterator[Engine]:
    engine = make_engine(own_database_url, application_name="sasflow-test")
    yield engine
    engine.dispose()


@pytest.fixture
def procs_on_own_database(
    tmp_path: Path, own_database_url: str, names: Names
) -> Iterator[Processes]:
    """The test's processes on its database of the module's PostgreSQL and the shared broker
    (untouched) under the test's namespace."""
    with processes(tmp_path, database_url=own_database_url, namespace=names.namespace) as procs:
        yield procs


def test_postgresql_restart_during_a_run_processes_reconnect_and_runs_complete(
    own_engine: Engine, procs_on_own_database: Processes, own_postgres: PrivatePostgres
) -> None:
    engine, procs = own_engine, procs_on_own_database
    _start_system_with_work_in_flight(engine, procs)
    own_postgres.instance.restart("fast")
    submitted = procs.run(
        "submit", "sleepy", "--input", '{"delay": 0}', "--key", "via-broker", "--via-broker"
    )
    assert submitted.returncode == 0, submitted.stderr
    harness.wait_for(
        harness.all_runs_in(engine, {"completed"}, 61),
        timeout=120,
        interval=0.2,
        what="every run completes after the database came back",
    )
    procs.assert_alive()
    with engine.connect() as conn:
        attempts = conn.execute(select(steps.c.attempt).distinct()).scalars().all()
    assert attempts == [1], "a step was dispatched twice"
