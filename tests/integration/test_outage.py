"""The outage alert on PostgreSQL and RabbitMQ (supervisor.outage): one `agent_outage` per
agent that has work waiting and nobody serving it, in place of the per-instance `agent_lost`
alerts when every instance is lost; none while no work waits; resolved when a consumer is
back; not raised again after an operator acknowledged it; `agent_lost` kept for one instance
lost among live ones. Heartbeats are written as a scheduler records them; the consumer is a
real agent worker on the broker."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow.ops import alerts as alert_ops
from sasflow.store.cluster import fleet
from sasflow.store.db import transaction
from sasflow.store.schema import alerts, events
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import basic

pytestmark = pytest.mark.integration


def _beat(agent: str, instance: str, interval_s: float) -> fleet.InstanceReport:
    return fleet.InstanceReport(
        instance_id=instance,
        agent=agent,
        hostname="host",
        pid=1,
        version="1",
        concurrency=1,
        in_flight=0,
        breakers={},
        interval_s=interval_s,
        seq=1,
    )


def _heartbeats(engine: Engine, *beats: fleet.InstanceReport) -> None:
    with transaction(engine) as conn:
        fleet.record_heartbeats(conn, list(beats))


def _alerts(engine: Engine) -> list[dict[str, Any]]:
    """The alerts, without the notices of resolved incidents (_resolved_notices)."""
    with engine.connect() as conn:
        query = select(alerts).where(alerts.c.kind != "incident_resolved").order_by(alerts.c.id)
        return [dict(r._mapping) for r in conn.execute(query)]


def _resolved_notices(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        query = select(alerts.c.detail).where(alerts.c.kind == "incident_resolved")
        return list(conn.execute(query).scalars())


def _supervisor(engine: Engine, names: Names, outage_after: float) -> Supervisor:
    return Supervisor(
        engine,
        names,
        transport=harness.transport("supervisor"),
        options=SupervisorOptions(interval=0.1, outage_after=outage_after),
    )


def test_every_instance_lost_with_work_waiting_is_one_outage_alert_resolved_when_back(
    engine: Engine, names: Names
) -> None:
    """Two instances of `echo` and two of `idle` stop heartbeating; a run waits for `echo`.
    The sweep marks all four lost without an `agent_lost` alert (none of either agent lives);
    past `outage_after` one `agent_outage` for `echo`, none for `idle` (nothing waits for it),
    and sweeping again raises nothing more. A consumer on echo's queue resolves it; gone
    again, it is a new outage, timed from its return."""
    _heartbeats(
        engine,
        _beat("echo", "echo-1", 0.2),
        _beat("echo", "echo-2", 0.2),
        _beat("idle", "idle-1", 0.2),
        _beat("idle", "idle-2", 0.2),
    )
    harness.submit(engine, basic.registry, names, "pipeline", key="k", run_input={"text": "x"})
    supervisor = _supervisor(engine, names, outage_after=1.5)
    try:
        time.sleep(0.7)
        first = supervisor.sweep_once()
        assert first is not None
        assert (first.agents_lost, first.alerts) == (4, [])
        time.sleep(1.5)
        second = supervisor.sweep_once()
        third = supervisor.sweep_once()
        assert second is not None
        assert third is not None
        assert (len(second.alerts), third.alerts) == (1, [])
        (outage,) = _alerts(engine)
        assert (outage["kind"], outage["dedup_key"]) == ("agent_outage", "agent_outage:echo")
        detail = outage["detail"]
        assert (detail["agent"], detail["steps"], detail["pending"]) == ("echo", 1, 1)
        assert (detail["live_instances"], detail["consumers"]) == (0, 0)
        assert detail["queue"] == names.agent("echo")
        assert "no consumer" in outage["message"]

        worker = harness.agent(basic.echo, names)
        with harness.running(worker):
            harness.wait_for(lambda: worker.fleet.heartbeats > 0, what="the agent consuming")
            back = supervisor.sweep_once()
        assert back is not None
        (resolved,) = _alerts(engine)
        assert resolved["acknowledged"] is True
        assert resolved["acknowledged_by"] == supervisor.id
        assert str(resolved["acknowledge_reason"]).startswith("agent 'echo' is back after")
        assert "back_at" in resolved["detail"]
        [notice] = _resolved_notices(engine)  # the outage's incident is over: sinks are told
        assert (notice["resolution"], notice["by"]) == ("recovered", supervisor.id)

        # Away again (the worker's heartbeats reached no scheduler: its last heard-of time is
        # the old instances'): a new outage, timed from its return.
        assert supervisor.sweep_once() is not None
        assert len(_alerts(engine)) == 1, "not before outage_after from its return"
        time.sleep(1.5)
        away_again = supervisor.sweep_once()
        assert away_again is not None
        assert len(away_again.alerts) == 1
        renewed = _alerts(engine)[-1]
        assert (renewed["kind"], renewed["acknowledged"]) == ("agent_outage", False)
        assert renewed["detail"]["since"] == resolved["detail"]["back_at"]
    finally:
        supervisor.close()
    with engine.connect() as conn:
        lost = (
            conn.execute(select(events.c.to_state).where(events.c.entity == "agent"))
            .scalars()
            .all()
        )
    assert lost == ["lost"] * 4, "each instance's loss is still in the history"


def test_live_instances_that_consume_nothing_are_an_outage_acknowledged_once(
    engine: Engine, names: Names
) -> None:
    """An instance heartbeats but nobody consumes the queue (a cancelled consumer): timed
    from when the supervisor first saw it so. Acknowledged by an operator while it lasts, it
    is not raised again for the same outage."""
    _heartbeats(engine, _beat("echo", "echo-1", 3600))
    harness.submit(engine, basic.registry, names, "pipeline", key="k", run_input={"text": "x"})
    supervisor = _supervisor(engine, names, outage_after=0.5)
    try:
        noticed = supervisor.sweep_once()
        assert noticed is not None
        assert noticed.alerts == []
        time.sleep(0.6)
        raised = supervisor.sweep_once()
        assert raised is not None
        assert len(raised.alerts) == 1
        (outage,) = _alerts(engine)
        assert (outage["detail"]["live_instances"], outage["detail"]["consumers"]) == (1, 0)
        assert "though 1 instance(s) heartbeat" in outage["message"]
        with transaction(engine) as conn:
            alert_ops.acknowledge(conn, outage["id"], actor="ops", reason="looking into it")
        again = supervisor.sweep_once()
        assert again is not None
        assert again.alerts == []
    finally:
        supervisor.close()
    assert len(_alerts(engine)) == 1


def test_one_instance_lost_among_live_ones_is_still_agent_lost(
    engine: Engine, names: Names
) -> None:
    """One `echo` instance stops heartbeating, the other lives and its agent consumes: one
    `agent_lost` for the lost instance, no outage although work waits."""
    _heartbeats(engine, _beat("echo", "echo-1", 0.2), _beat("echo", "echo-2", 3600))
    harness.submit(engine, basic.registry, names, "pipeline", key="k", run_input={"text": "x"})
    supervisor = _supervisor(engine, names, outage_after=0.1)
    worker = harness.agent(basic.echo, names)
    try:
        with harness.running(worker):
            harness.wait_for(lambda: worker.fleet.heartbeats > 0, what="the agent consuming")
            time.sleep(0.7)
            report = supervisor.sweep_once()
            later = supervisor.sweep_once()
    finally:
        supervisor.close()
    assert report is not None
    assert later is not None
    assert (report.agents_lost, len(report.alerts), later.alerts) == (1, 1, [])
    assert [(a["kind"], a["dedup_key"]) for a in _alerts(engine)] == [
        ("agent_lost", "agent_lost:echo-1")
    ]
