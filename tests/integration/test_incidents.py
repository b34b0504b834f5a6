"""Incidents on PostgreSQL and RabbitMQ: a hundred runs failing alike are one incident, sent
once per sink with its count, acknowledged together, and a resolved notice follows."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner, Result
from pika.exchange_type import ExchangeType
from sqlalchemy import Engine, select, text, update

from sasflow.cli.main import cli
from sasflow.errors import IncidentAlreadyAcknowledgedError
from sasflow.ops import alerts as alert_ops
from sasflow.ops import incidents as incident_ops
from sasflow.store.db import run_transaction
from sasflow.store.operator import audit
from sasflow.store.outbox.alerts import Alert, raise_alert
from sasflow.store.schema import alerts, incidents, runs
from sasflow.supervisor.dispatch import AlertDispatcher
from sasflow.supervisor.sinks import AlertRecord, ExchangeSink, WebhookSink
from sasflow.transport.base import Transport
from sasflow.transport.topology import Names
from tests import harness, services
from tests.apps import declines
from tests.integration.alert_rows import raise_alerts
from tests.integration.webhook import bodies, url_of, webhook_server

pytestmark = pytest.mark.integration

RUNS = 100


class RecordingSink:
    name = "recording"

    def __init__(self) -> None:
        self.received: list[AlertRecord] = []

    def send(self, alert: AlertRecord) -> None:
        self.received.append(alert)


@pytest.fixture
def alert_queue(names: Names) -> str:
    """A queue bound to every alert of the test's `<ns>.alerts` exchange."""
    queue = f"{names.namespace}.test-incidents"
    with services.broker_channel() as channel:
        channel.exchange_declare(names.alerts, exchange_type=ExchangeType("topic"), durable=True)
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, names.alerts, routing_key="alert.#")
    return queue


def _fail_runs(engine: Engine, database_url: str, names: Names, count: int) -> list[int]:
    with harness.running(
        harness.scheduler(engine, database_url, declines.registry, names, rescan_interval=0.1),
        harness.agent(declines.cards, names, concurrency=8),
    ):
        ids = [
            harness.submit(
                engine,
                declines.registry,
                names,
                "card_payment",
                key=f"order-{i}",
                run_input={"order": 1000 + i},
            )
            for i in range(count)
        ]
        harness.wait_for(
            harness.all_runs_in(engine, {"error"}, count), timeout=120, what="runs in error"
        )
    return ids


def _ack(engine: Engine, incident_id: int) -> dict[str, Any]:
    done: dict[str, Any] = run_transaction(
        engine,
        lambda conn: incident_ops.acknowledge(
            conn, incident_id, actor="alice", reason="issuer outage, INC-42"
        ),
    )
    return done


def test_a_hundred_runs_failing_alike_are_one_incident_sent_once_per_sink_and_resolved_once(
    engine: Engine, database_url: str, names: Names, alert_queue: str
) -> None:
    run_ids = _fail_runs(engine, database_url, names, RUNS)
    with engine.connect() as conn:
        [incident] = conn.execute(select(incidents)).all()
        grouped = conn.execute(select(alerts).order_by(alerts.c.id)).all()
        first_key = conn.execute(
            select(runs.c.business_key).where(runs.c.id == grouped[0].run_id)
        ).scalar_one()
    assert (incident.kind, incident.workflow, incident.alert_count) == (
        "step_failed",
        "card_payment",
        RUNS,
    )
    assert incident.cause == (
        "step_failed in card_payment at step 'charge': PermanentError: "
        "card declined for order <n> (ref <id>)"
    )
    assert sorted(a.run_id for a in grouped) == run_ids
    assert {a.incident_id for a in grouped} == {incident.id}
    # Only the first is left for the sinks; the others are counted, not sent.
    assert [a.notified_at is None for a in grouped] == [True] + [False] * (RUNS - 1)
    assert all(a.delivered_to == [] for a in grouped[1:])

    recording = RecordingSink()
    with webhook_server() as server:

        def factory() -> Transport:
            return harness.transport("alerts")

        exchange = ExchangeSink(factory, names)
        dispatcher = AlertDispatcher(
            engine, [WebhookSink(url_of(server)), exchange, recording], namespace=names.namespace
        )
        try:
            assert dispatcher.dispatch_pending(10) == 1
            done = _ack(engine, incident.id)
            assert dispatcher.dispatch_pending(10) == 1
            assert dispatcher.dispatch_pending(10) == 0
        finally:
            dispatcher.stop()
        sent = bodies(server)
    published = harness.drain_json(alert_queue, until=lambda m: len(m) >= 2, timeout=10)

    first, resolved = sent
    assert {k: first[k] for k in ("id", "kind", "incident_id", "count", "workflow")} == {
        "id": grouped[0].id,
        "kind": "step_failed",
        "incident_id": incident.id,
        "count": RUNS,
        "workflow": "card_payment",
    }
    assert (first["business_key"], first["cause"]) == (first_key, incident.cause)
    assert resolved["kind"] == "incident_resolved"
    assert resolved["incident_id"] == incident.id
    assert resolved["count"] == RUNS
    assert resolved["detail"]["resolution"] == "acknowledged"
    assert resolved["detail"]["by"] == "alice"
    assert resolved["message"].startswith(f"incident {incident.id} resolved after {RUNS} alert(s)")
    assert [(m["_routing_key"], m["id"], m["count"]) for m in published] == [
        ("alert.step_failed", first["id"], RUNS),
        ("alert.incident_resolved", resolved["id"], RUNS),
    ]
    assert published[0]["_headers"] == {
        "x-sasflow-alert-id": first["id"],
        "x-sasflow-incident-id": incident.id,
    }
    assert [a.kind for a in recording.received] == ["step_failed", "incident_resolved"]

    assert done["alerts_acknowledged"] == RUNS
    with engine.connect() as conn:
        assert conn.execute(
            select(alerts.c.acknowledged_by, alerts.c.acknowledge_reason)
            .where(alerts.c.kind == "step_failed")
            .distinct()
        ).all() == [("alice", "issuer outage, INC-42")]
        [entry] = audit.recent(conn, action=incident_ops.ACK_ACTION)
    assert (entry["actor"], entry["reason"]) == ("alice", "issuer outage, INC-42")
    assert entry["detail"]["alerts_acknowledged"] == RUNS
    with pytest.raises(IncidentAlreadyAcknowledgedError, match="by alice"):
        _ack(engine, incident.id)


def _raise(engine: Engine, subject: str, order: int, workflow: str = "card_payment") -> int:
    alert = Alert(
        "step_failed",
        subject,
        f"order {order} failed",
        detail={"step": "charge", "error": {"type": "PermanentError", "message": f"no {order}"}},
        workflow=workflow,
    )
    with engine.begin() as conn:
        alert_id = raise_alert(conn, alert)
    assert alert_id is not None
    return alert_id


def _incident_of(engine: Engine, alert_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(incidents)
            .join(alerts, alerts.c.incident_id == incidents.c.id)
            .where(alerts.c.id == alert_id)
        ).one()


def test_an_incident_whose_last_open_alert_is_acknowledged_resolves_and_the_next_opens_anew(
    engine: Engine,
) -> None:
    """Its runs all left error (resubmitted, cancelled) or its alerts were acknowledged one by
    one: the incident is over, `recovered`, with a resolved notice; the same cause later is a
    new incident, sent again."""
    first, second = _raise(engine, "1", 1), _raise(engine, "2", 2)
    incident = _incident_of(engine, first)
    assert (incident.alert_count, _incident_of(engine, second).id) == (2, incident.id)

    for alert_id in (first, second):
        with engine.begin() as conn:
            alert_ops.acknowledge(conn, alert_id, actor="bob", reason="retried")
    with engine.connect() as conn:
        closed = conn.execute(select(incidents).where(incidents.c.id == incident.id)).one()
        [notice] = conn.execute(select(alerts).where(alerts.c.kind == "incident_resolved")).all()
    assert (closed.acknowledged, closed.acknowledged_by) == (True, "bob")
    assert notice.notified_at is None  # for the sinks
    assert notice.acknowledged  # never open
    assert notice.detail["resolution"] == "recovered"
    assert notice.incident_id == incident.id

    third = _raise(engine, "3", 3)
    again = _incident_of(engine, third)
    assert (again.id != incident.id, again.alert_count, again.cause) == (
        True,
        1,
        incident.cause,
    )
    with engine.connect() as conn:
        assert (
            conn.execute(select(alerts.c.notified_at).where(alerts.c.id == third)).scalar_one()
            is None
        )
    with engine.connect() as conn:
        listed = alert_ops.list_alerts(conn, include_acknowledged=True)
        notices = alert_ops.list_alerts(conn, include_acknowledged=True, kind="incident_resolved")
    assert [a["id"] for a in listed] == [third, second, first]  # a notice is no alert
    assert [a["id"] for a in notices] == [notice.id]


def test_sasflow_alerts_incidents_lists_them_at_80_columns_and_ack_incident_takes_all(
    engine: Engine, database_url: str
) -> None:
    alert_ids = [_raise(engine, str(i), i) for i in range(3)]
    [other] = raise_alerts(engine, 1, kind="stalled")
    env = {"SASFLOW_DATABASE_URL": database_url, "COLUMNS": "80"}

    def sasflow(*args: str, exit_code: int = 0) -> Result:
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == exit_code, result.output
        return result

    listed = json.loads(sasflow("alerts", "incidents", "-o", "json").output)
    assert [(i["kind"], i["alert_count"]) for i in listed] == [("stalled", 1), ("step_failed", 3)]
    incident_id = listed[1]["id"]
    table = sasflow("alerts", "incidents").output
    assert max(len(line) for line in table.splitlines()) <= 80
    assert "2 open incident(s)" in table
    assert "PermanentError: no <n>" in " ".join(table.split())
    shown = json.loads(sasflow("alerts", "incident", str(incident_id), "-o", "json").output)
    assert ([a["id"] for a in shown["alerts"]], shown["open_alerts"]) == (alert_ids, 3)

    acked = sasflow(
        "alerts", "ack", "--incident", str(incident_id), "--reason", "known", "--by", "carol"
    )
    assert acked.output.startswith(f"acknowledged incident {incident_id} (3 alert(s), 3 open")
    again = sasflow("alerts", "ack", "--incident", str(incident_id), "--reason", "x", exit_code=1)
    assert f"incident {incident_id} is already acknowledged (by carol" in again.output
    sasflow("alerts", "ack", "--reason", "x", exit_code=2)  # neither an alert nor an incident

    open_now = json.loads(sasflow("alerts", "list", "-o", "json").output)
    assert [a["id"] for a in open_now] == [other]
    assert [i["id"] for i in json.loads(sasflow("alerts", "incidents", "-o", "json").output)] == [
        listed[0]["id"]
    ]


def test_an_alert_counted_while_the_last_one_is_acknowledged_keeps_its_incident_open(
    engine: Engine,
) -> None:
    """A raiser holds its incident's row until it commits; closing waits for it and then sees
    the new alert open: the incident stays open (else that alert, not sent on its own, would
    sit in a closed incident and nobody would hear of it)."""
    first = _raise(engine, "r1", 1)
    incident = _incident_of(engine, first)
    closer_errors: list[BaseException] = []

    def close() -> None:
        try:
            with engine.begin() as conn:
                alert_ops.acknowledge(conn, first, actor="bob", reason="resubmitted")
        except BaseException as exc:
            closer_errors.append(exc)
            raise

    with engine.begin() as raiser:
        second = raise_alert(
            raiser,
            Alert(
                "step_failed",
                "r2",
                "order 2 failed",
                detail={"step": "charge", "error": {"type": "PermanentError", "message": "no 2"}},
                workflow="card_payment",
            ),
        )
        closer = threading.Thread(target=close)
        closer.start()
        harness.wait_for(lambda: _waiting_for_a_lock(engine), what="the closer waiting")
    closer.join(10)

    assert not closer.is_alive()
    assert closer_errors == []
    now = _incident_of(engine, first)
    assert (now.id, now.acknowledged, now.alert_count) == (incident.id, False, 2)
    assert second is not None
    assert _incident_of(engine, second).id == incident.id


def _waiting_for_a_lock(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                    "WHERE NOT l.granted AND a.datname = current_database()"
                )
            ).scalar_one()
        )


def test_an_open_incident_counting_new_alerts_is_reminded_at_most_every_interval(
    engine: Engine,
) -> None:
    """The sinks hear of an incident's first alert; later ones only through a "still
    happening" notice, once `remind_every` passed since they last heard of it, and only if
    it counted alerts since."""
    recording = RecordingSink()
    dispatcher = AlertDispatcher(engine, [recording], namespace="ns", remind_every=3600)
    try:
        first = _raise(engine, "m1", 1)
        assert dispatcher.dispatch_pending(10) == 1
        _raise(engine, "m2", 2)
        assert dispatcher.dispatch_pending(10) == 0, "within the hour: nothing"
        with engine.begin() as conn:  # the first alert was raised and sent two hours ago
            conn.execute(
                update(alerts)
                .where(alerts.c.id == first)
                .values(
                    created_at=alerts.c.created_at - timedelta(hours=2),
                    notified_at=alerts.c.notified_at - timedelta(hours=2),
                )
            )
        assert dispatcher.dispatch_pending(10) == 1
        assert dispatcher.dispatch_pending(10) == 0, "told now: the next hour is quiet"
        _raise(engine, "m3", 3)
        assert dispatcher.dispatch_pending(10) == 0
    finally:
        dispatcher.stop()

    first_sent, reminder = recording.received
    assert (first_sent.id, first_sent.count) == (first, 1)
    assert reminder.kind == "incident_ongoing"
    assert (reminder.incident_id, reminder.count) == (first_sent.incident_id, 2)
    assert reminder.detail["since_last_notice"] == 1
    assert reminder.message.startswith(
        f"incident {first_sent.incident_id} still happening: 2 alert(s), 1 since"
    )


def test_no_reminder_when_reminders_are_off_or_nothing_new_came(engine: Engine) -> None:
    first = _raise(engine, "q1", 1)
    quiet = RecordingSink()
    dispatcher = AlertDispatcher(engine, [quiet], namespace="ns", remind_every=0.001)
    off = AlertDispatcher(engine, [quiet], namespace="ns")
    try:
        assert dispatcher.dispatch_pending(10) == 1
        harness.wait_for(lambda: dispatcher.dispatch_pending(10) == 0, what="a quiet dispatch")
        _raise(engine, "q2", 2)
        with engine.begin() as conn:  # sent long ago
            conn.execute(
                update(alerts)
                .where(alerts.c.id == first)
                .values(notified_at=alerts.c.notified_at - timedelta(hours=2))
            )
        assert off.dispatch_pending(10) == 0
    finally:
        dispatcher.stop()
        off.stop()
    assert [a.id for a in quiet.received] == [first]


def test_retention_deletes_incidents_closed_longer_ago_than_kept_with_their_notices(
    engine: Engine,
) -> None:
    """The alerts of a closed incident whose runs are still kept only lose the link; an open
    incident and a recently closed one stay; the pass is one audit record."""
    old, recent, still_open = (
        _raise(engine, f"k{i}", i, workflow=f"w{i}") for i in range(3)
    )  # three workflows: three causes, three incidents
    old_incident, recent_incident = _incident_of(engine, old), _incident_of(engine, recent)
    for alert_id in (old, recent):
        with engine.begin() as conn:
            alert_ops.acknowledge(conn, alert_id, actor="bob", reason="done")
    with engine.begin() as conn:  # the first closed two days ago
        conn.execute(
            update(incidents)
            .where(incidents.c.id == old_incident.id)
            .values(acknowledged_at=incidents.c.acknowledged_at - timedelta(days=2))
        )

    pruned, complete = incident_ops.prune_closed(engine, 86_400, actor="supervisor-1")

    assert (pruned, complete) == (1, True)
    with engine.connect() as conn:
        left = conn.execute(select(incidents.c.id).order_by(incidents.c.id)).scalars().all()
        notices = (
            conn.execute(select(alerts.c.incident_id).where(alerts.c.kind == "incident_resolved"))
            .scalars()
            .all()
        )
        kept = conn.execute(select(alerts.c.incident_id).where(alerts.c.id == old)).scalar_one()
        [entry] = audit.recent(conn, action=incident_ops.PRUNE_ACTION)
    assert old_incident.id not in left
    assert recent_incident.id in left
    assert _incident_of(engine, still_open).id in left
    assert notices == [recent_incident.id]
    assert kept is None
    assert (entry["actor"], entry["detail"]["pruned"]) == ("supervisor-1", 1)
