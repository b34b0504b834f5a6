"""The agent fleet on the real broker and database: heartbeats recorded by a scheduler, a goodbye
on a clean exit, `lost` after 3 missed heartbeats (one alert, one fleet event), a malformed
heartbeat dead-lettered, and breakers shared between the instances of one agent."""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, select

from sasflow import BreakerPolicy, Registry
from sasflow.agents import Agent, BreakerOpenError
from sasflow.agents.worker import AgentOptions, AgentWorker
from sasflow.cli.main import cli
from sasflow.fleet_messages import AgentHeartbeat
from sasflow.ops import stream as stream_ops
from sasflow.ops.agents import list_agents
from sasflow.store.cluster import fleet
from sasflow.store.db import transaction
from sasflow.store.outbox import stream
from sasflow.store.schema import alerts, events
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness, services

pytestmark = pytest.mark.integration


def _instances(engine: Engine, **options: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return list_agents(conn, **options)


def _every_failure(exc: BaseException) -> bool:
    return True


def _worker(agent: Agent, names: Names, interval: float = 0.2) -> AgentWorker:
    return AgentWorker(
        agent,
        harness.transport(f"agent-{agent.name}"),
        names,
        concurrency=2,
        options=AgentOptions(heartbeat_interval=interval),
    )


def test_heartbeats_are_recorded_and_a_clean_exit_says_goodbye(
    engine: Engine, database_url: str, names: Names
) -> None:
    echo = Agent("echo", breakers={"remote": BreakerPolicy()})
    registry = Registry([], [echo])
    worker = _worker(echo, names)
    scheduler = harness.scheduler(engine, database_url, registry, names, fleet_interval=0.1)
    with harness.running(scheduler):
        with harness.running(worker):
            harness.wait_for(lambda: len(_instances(engine)) == 1, what="the instance")
            first = _instances(engine)[0]["heartbeat_at"]
            harness.wait_for(
                lambda: _instances(engine)[0]["heartbeat_at"] > first, what="a second heartbeat"
            )
            (live,) = _instances(engine)
        harness.wait_for(lambda: not _instances(engine), what="the goodbye")
        (stopped,) = _instances(engine, include_stopped=True)
    expected = {
        "agent": "echo",
        "instance_id": worker.id,
        "concurrency": 2,
        "in_flight": 0,
        "breakers": {"remote": "closed"},
        "interval_s": 0.2,
    }
    assert {k: live[k] for k in expected} == expected
    assert (live["state"], stopped["state"]) == ("live", "stopped")
    assert stopped["gone_at"] is not None


def test_a_heartbeat_older_than_the_one_recorded_does_not_undo_a_goodbye(engine: Engine) -> None:
    """Schedulers take heartbeats concurrently: a late one (lower seq) changes nothing."""
    beat = fleet.InstanceReport("i-1", "echo", "host", 1, "1", 4, 0, {}, 5.0, seq=7)
    goodbye = replace(beat, seq=8, stopping=True)
    with engine.begin() as conn:
        fleet.record_heartbeats(conn, [goodbye, beat])  # one poll, out of order
    with engine.begin() as conn:
        fleet.record_heartbeats(conn, [beat])  # another scheduler, later
    ((state, seq),) = [(i["state"], i["seq"]) for i in _instances(engine, include_stopped=True)]
    assert (state, seq) == ("stopped", 8)


def test_an_instance_that_misses_three_heartbeats_is_lost_once(
    engine: Engine, database_url: str, names: Names
) -> None:
    """(A malformed heartbeat beside it is dead-lettered with the reason.) Its last heartbeat
    said it would beat every 0.2 s; after 0.6 s without one on the
    database clock the list shows it lost, and the supervisor marks it, raises one agent_lost
    alert (another instance of its agent lives: tests/integration/test_outage.py has the
    agent whose every instance is lost) and appends one fleet event, however often it
    passes."""
    heartbeat = AgentHeartbeat(
        agent="ghost",
        instance_id="agent-ghost:host:1:deadbeef",
        hostname="host",
        pid=1,
        version="1",
        concurrency=4,
        in_flight=2,
        interval_s=0.2,
    )
    survivor = heartbeat.model_copy(
        update={
            "instance_id": "agent-ghost:host-z:2:cafe",
            "hostname": "host-z",
            "pid": 2,
            "interval_s": 3600,
        }
    )
    with harness.running(harness.scheduler(engine, database_url, Registry(), names)):
        harness.wait_for(lambda: services.queue_exists(names.fleet), what="the fleet queue")
        harness.publish_to_exchange(names.fleet, "x", b'{"type": "agent.heartbeat", "pid": -1}')
        harness.publish_to_exchange(names.fleet, "ghost", heartbeat.encode())
        harness.publish_to_exchange(names.fleet, "ghost", survivor.encode())
        harness.wait_for(lambda: len(_instances(engine)) == 2, what="the heartbeats recorded")
        (dead,) = harness.dead_letters(names, 1)
    assert "AgentHeartbeat" in dead["reason"], "a malformed heartbeat is dead-lettered"
    assert "pid" in dead["reason"]
    harness.wait_for(
        lambda: _instances(engine)[0]["state"] == "lost", what="the list showing it lost"
    )
    listed = CliRunner().invoke(
        cli,
        ["agents", "list", "-o", "json"],
        env={"SASFLOW_DATABASE_URL": database_url, "SASFLOW_NAMESPACE": names.namespace},
    )
    assert listed.exit_code == 0, listed.output
    assert [(i["agent"], i["state"]) for i in json.loads(listed.output)] == [
        ("ghost", "lost"),
        ("ghost", "live"),
    ]
    with transaction(engine) as conn:
        subscriber, stream_id = stream_ops.subscribe(
            conn,
            name="watcher",
            subscriber_id=None,
            where=stream_ops.StreamFilter(),
            owner="ops",
            namespace=names.namespace,
        )
    supervisor = Supervisor(engine, names, options=SupervisorOptions(interval=0.1))
    first = supervisor.sweep_once()
    second = supervisor.sweep_once()
    assert first is not None
    assert second is not None
    assert (first.agents_lost, len(first.alerts), second.agents_lost) == (1, 1, 0)
    with engine.connect() as conn:
        raised = conn.execute(select(alerts.c.kind, alerts.c.dedup_key, alerts.c.detail)).all()
        fleet_events = conn.execute(
            select(
                events.c.run_id, events.c.from_state, events.c.to_state, events.c.published
            ).where(events.c.entity == "agent")
        ).all()
    ((kind, key, detail),) = raised
    assert (kind, key) == ("agent_lost", "agent_lost:agent-ghost:host:1:deadbeef")
    assert (detail["agent"], detail["in_flight"]) == ("ghost", 2)
    assert [tuple(e) for e in fleet_events] == [(None, "live", "lost", True)]
    with transaction(engine) as conn:
        assert stream.lock_if_current(conn, subscriber.id, stream_id)
        due = stream.take_due(conn, subscriber.id, stream_id, resend_after=60, limit=10)
    assert [(d.uuid, d.body["type"], d.body["instance_id"]) for d in due] == [
        (None, "FAILURE", "agent-ghost:host:1:deadbeef")
    ], "subscribers get one FAILURE record, sent once, with no uuid to acknowledge"


def test_a_breaker_opened_by_one_instance_opens_its_peers_and_a_trial_closes_them(
    names: Names,
) -> None:
    """Instance A trips on its own failures; B, which never called the service, opens for the
    rest of A's reset timeout; once it is over, B's successful trial call closes A too."""
    policy = BreakerPolicy(fail_max=2, reset_timeout=1.5)

    def make() -> AgentWorker:
        return _worker(Agent("shared", breakers={"svc": policy}), names)

    a, b = make(), make()

    def fail() -> None:
        raise ConnectionError("down")

    with harness.running(a, b):
        harness.wait_for(lambda: a.fleet.heartbeats > 0 and b.fleet.heartbeats > 0)
        for _ in range(2):
            with pytest.raises(ConnectionError):
                a.breaker("svc").call(fail, _every_failure)
        assert a.breaker("svc").state == "open"
        harness.wait_for(lambda: b.breaker("svc").state == "open", timeout=5, what="B opens")
        open_for = b.breaker("svc").open_for()
        assert open_for is not None
        assert 0 < open_for <= 1.5
        harness.wait_for(lambda: b.breaker("svc").open_for() == 0.0, what="B's trial is due")
        assert b.breaker("svc").call(lambda: "ok", _every_failure) == "ok"
        assert b.breaker("svc").state == "closed"
        harness.wait_for(lambda: a.breaker("svc").state == "closed", timeout=5, what="A closes")
    assert (a.fleet.announced, b.fleet.announced) == (1, 1)
    assert (a.fleet.applied, b.fleet.applied) == (1, 1)


def test_breaker_changes_from_many_threads_are_announced_without_blocking_the_breaker(
    names: Names,
) -> None:
    """The announcement is queued under the breaker's lock and published by the owner thread:
    8 threads failing at once trip it once and announce it once."""
    worker = _worker(
        Agent("busy", breakers={"svc": BreakerPolicy(fail_max=3, reset_timeout=60)}), names
    )
    start = threading.Barrier(8)

    def fail() -> None:
        start.wait()
        raise ConnectionError("down")

    def call() -> None:
        # The failure (or the open breaker) is expected.
        with contextlib.suppress(ConnectionError, BreakerOpenError):
            worker.breaker("svc").call(fail, _every_failure)

    with harness.running(worker):
        threads = [threading.Thread(target=call) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        harness.wait_for(lambda: worker.fleet.announced == 1, what="one announcement")
    assert worker.breaker("svc").state == "open"
