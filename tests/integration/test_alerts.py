"""Alert delivery on real services: a webhook server, an SMTP server and the broker started by
the test; the dispatcher's outbox on the test's database; `sasflow alerts list | show | ack`."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from email import message_from_bytes, policy
from email.message import EmailMessage

import pytest
from pika.exchange_type import ExchangeType
from sqlalchemy import Engine, select, update

from sasflow.store.db import make_engine
from sasflow.store.schema import alerts
from sasflow.supervisor.dispatch import AlertDispatcher
from sasflow.supervisor.sinks import (
    AlertRecord,
    DeliveryError,
    EmailSink,
    ExchangeSink,
    LogSink,
    WebhookSink,
)
from sasflow.transport.base import Transport
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names
from tests import harness, services
from tests.integration.alert_rows import raise_alerts
from tests.integration.webhook import bodies, serving, url_of, webhook_server

pytestmark = pytest.mark.integration

RECORD = AlertRecord(
    id=1,
    kind="step_failed",
    message="step charge failed",
    run_id=None,
    step_id=None,
    detail={"attempt": 3},
    created_at="2025-01-31T12:00:00+00:00",
    namespace="test",
)


# --- an SMTP receiver (just enough of RFC 5321; smtpd is deprecated) ---------------------


class SmtpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    envelopes: list[tuple[str, list[str], bytes]]


class _SmtpSession(socketserver.StreamRequestHandler):
    server: SmtpServer

    def reply(self, line: str) -> None:
        self.wfile.write(f"{line}\r\n".encode())

    def handle(self) -> None:
        self.reply("220 test.invalid ESMTP")
        sender, recipients = "", []
        while line := self.rfile.readline():
            command = line.decode("ascii", "replace").strip()
            verb = command[:4].upper()
            if verb == "EHLO":
                self.reply("250-test.invalid")
                self.reply("250 8BITMIME")
            elif verb in {"HELO", "RSET", "NOOP"}:
                self.reply("250 ok")
            elif verb == "MAIL":
                sender = command.partition(":")[2].strip().split()[0].strip("<>")
                self.reply("250 ok")
            elif verb == "RCPT":
                recipients.append(command.partition(":")[2].strip().strip("<>"))
                self.reply("250 ok")
            elif verb == "DATA":
                self.reply("354 end with <CRLF>.<CRLF>")
                self.server.envelopes.append((sender, recipients, self._data()))
                self.reply("250 queued")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("502 not implemented")

    def _data(self) -> bytes:
        lines = []
        while (line := self.rfile.readline()) not in {b".\r\n", b""}:
            lines.append(line[1:] if line.startswith(b"..") else line)
        return b"".join(lines)


@contextlib.contextmanager
def smtp_server() -> Iterator[SmtpServer]:
    server = SmtpServer(("127.0.0.1", 0), _SmtpSession)
    server.envelopes = []
    with serving(server):
        yield server


# --- sinks the tests control ---------------------------------------------------------------


class RecordingSink:
    def __init__(self, name: str = "recording") -> None:
        self.name = name
        self.received: list[AlertRecord] = []

    def send(self, alert: AlertRecord) -> None:
        self.received.append(alert)


class FailingSink:
    """Fails every alert until made `healthy`; `sent`: what it took since."""

    name = "failing"

    def __init__(self) -> None:
        self.healthy = False
        self.sent: list[int] = []

    def send(self, alert: AlertRecord) -> None:
        if not self.healthy:
            raise RuntimeError(f"boom on {alert.id}")
        self.sent.append(alert.id)


class BlockedSink(RecordingSink):
    """Hangs in `send` until released (a dead SMTP relay, a webhook that never answers)."""

    def __init__(self) -> None:
        super().__init__("blocked")
        self.release = threading.Event()

    def send(self, alert: AlertRecord) -> None:
        self.release.wait(30)
        super().send(alert)


def unnotified(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(alerts.c.id).where(alerts.c.notified_at.is_(None)).order_by(alerts.c.id)
            ).scalars()
        )


# --- (a) webhook -----------------------------------------------------------------------------


def test_webhook_posts_the_alert_json_with_basic_auth_from_the_url() -> None:
    with webhook_server() as server:
        url = url_of(server).replace("http://", "http://bot:s3cret@")
        WebhookSink(url).send(RECORD)

    [(headers, body)] = server.requests
    assert headers["Content-Type"] == "application/json"
    assert headers["Authorization"] == "Basic Ym90OnMzY3JldA=="  # bot:s3cret
    assert json.loads(body) == json.loads(RECORD.to_json())


def test_webhook_answering_500_twice_gets_the_alert_on_the_third_attempt() -> None:
    with webhook_server(500, 500, 200) as server:
        WebhookSink(url_of(server), attempts=3, backoff=0.01).send(RECORD)

    assert bodies(server) == [json.loads(RECORD.to_json())] * 3


def test_webhook_failing_every_attempt_raises_without_showing_the_path() -> None:
    with webhook_server(503, 503, 503) as server, pytest.raises(DeliveryError) as failed:
        WebhookSink(url_of(server), attempts=3, backoff=0.01).send(RECORD)

    assert len(server.requests) == 3
    assert "HTTP 503" in str(failed.value)
    assert "T0K3N" not in str(failed.value)


def test_webhook_client_error_is_not_retried() -> None:
    with webhook_server(404) as server, pytest.raises(DeliveryError, match="HTTP 404"):
        WebhookSink(url_of(server), attempts=3, backoff=0.01).send(RECORD)

    assert len(server.requests) == 1


def test_webhook_retries_stay_within_the_total_time() -> None:
    """Nobody listens: every attempt fails at once, and no wait outlasts total_timeout."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sink = WebhookSink(f"http://127.0.0.1:{port}/", attempts=50, backoff=0.2, total_timeout=1.0)
    started = time.monotonic()

    with pytest.raises(DeliveryError, match="refused"):
        sink.send(RECORD)

    assert time.monotonic() - started < 1.5


# --- (b) the dispatcher ----------------------------------------------------------------------


def test_dispatch_sends_each_alert_to_every_sink_once_and_marks_it_notified(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    ids = raise_alerts(engine, 3)
    recording = RecordingSink()
    with webhook_server() as server, caplog.at_level(logging.WARNING, logger="sasflow.alerts"):
        dispatcher = AlertDispatcher(
            engine, [LogSink(), WebhookSink(url_of(server)), recording], namespace="ns1"
        )
        first = dispatcher.dispatch_pending(10)
        second = dispatcher.dispatch_pending(10)
        dispatcher.stop()

    assert (first, second) == (3, 0)
    assert unnotified(engine) == []
    assert [b["id"] for b in bodies(server)] == ids
    assert [(a.id, a.namespace) for a in recording.received] == [(i, "ns1") for i in ids]
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.name == "sasflow.alerts"] == [
        f"alert {i} step_failed" for i in ids
    ]


def test_a_failing_sink_stops_neither_the_other_sinks_nor_later_alerts(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Its failure is logged with the alert id; the alert is not marked notified: it keeps the
    sinks that took it and the failing one's error, and waits for its retry, while later
    alerts go out."""
    ids = raise_alerts(engine, 2)
    recording, failing = RecordingSink(), FailingSink()
    with webhook_server() as server, caplog.at_level(logging.WARNING):
        dispatcher = AlertDispatcher(
            engine,
            [failing, LogSink(), WebhookSink(url_of(server)), recording],
            namespace="ns1",
        )
        marked = dispatcher.dispatch_pending(10)
        [later] = raise_alerts(engine, 1, kind="stalled")  # another subject: not deduplicated
        failing.healthy = True  # the later alert reaches every sink at once
        marked_later = dispatcher.dispatch_pending(10)
        dispatcher.stop()

    assert (marked, marked_later) == (0, 1)
    assert unnotified(engine) == ids
    assert [b["id"] for b in bodies(server)] == [*ids, later]
    assert [a.id for a in recording.received] == [*ids, later]
    failures = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert failures == [
        f"alert {i} (step_failed) not delivered by sink failing: boom on {i}" for i in ids
    ]
    with engine.connect() as conn:
        rows = conn.execute(select(alerts).where(alerts.c.id.in_(ids)).order_by(alerts.c.id)).all()
    for row in rows:
        assert row.delivered_to == ["log", "webhook", "recording"]
        assert row.delivery_errors == {"failing": f"RuntimeError: boom on {row.id}"}
        assert row.delivery_attempts == 1
        assert row.retry_at is not None


def test_a_failed_sink_gets_the_alert_again_alone_once_its_retry_is_due(
    engine: Engine,
) -> None:
    [alert_id] = raise_alerts(engine, 1)
    recording, failing = RecordingSink(), FailingSink()
    dispatcher = AlertDispatcher(engine, [failing, recording], namespace="ns1")
    try:
        assert dispatcher.dispatch_pending(10) == 0
        failing.healthy = True
        assert dispatcher.dispatch_pending(10) == 0  # its retry is not due yet
        with engine.begin() as conn:
            conn.execute(update(alerts).values(retry_at=None))
        assert dispatcher.dispatch_pending(10) == 1
    finally:
        dispatcher.stop()
    assert failing.sent == [alert_id]
    assert [a.id for a in recording.received] == [alert_id]  # once: it had taken it
    with engine.connect() as conn:
        row = conn.execute(select(alerts).where(alerts.c.id == alert_id)).one()
    assert (row.delivered_to, row.delivery_errors, row.delivery_attempts) == (
        ["recording", "failing"],
        None,
        2,
    )
    assert row.notified_at is not None


def test_a_sink_still_failing_a_day_later_is_given_up_with_its_error_kept(
    engine: Engine,
) -> None:
    [alert_id] = raise_alerts(engine, 1)
    with engine.begin() as conn:
        conn.execute(
            update(alerts).values(created_at=alerts.c.created_at - timedelta(days=1, seconds=1))
        )
    dispatcher = AlertDispatcher(engine, [FailingSink(), RecordingSink()], namespace="ns1")
    try:
        assert dispatcher.dispatch_pending(10) == 1
    finally:
        dispatcher.stop()
    with engine.connect() as conn:
        row = conn.execute(select(alerts).where(alerts.c.id == alert_id)).one()
    assert row.notified_at is not None
    assert row.retry_at is None
    assert row.delivered_to == ["recording"]
    assert row.delivery_errors == {"failing": f"RuntimeError: boom on {alert_id}"}


def test_a_hung_sink_does_not_hold_dispatch_past_its_budget_nor_get_alerts_twice(
    engine: Engine,
) -> None:
    [alert_id] = raise_alerts(engine, 1)
    blocked, recording = BlockedSink(), RecordingSink()
    dispatcher = AlertDispatcher(engine, [blocked, recording], namespace="ns1")
    try:
        started = time.monotonic()
        marked = dispatcher.dispatch_pending(0.5)
        elapsed = time.monotonic() - started

        assert (marked, unnotified(engine)) == (0, [alert_id])  # left for the next dispatch
        assert 0.4 < elapsed < 1.0
        assert [a.id for a in recording.received] == [alert_id]  # the others were not held up
        assert dispatcher.dispatch_pending(0.2) == 0  # still hung: the same attempt, not a new one

        blocked.release.set()
        assert dispatcher.dispatch_pending(10) == 1
    finally:
        blocked.release.set()
        dispatcher.stop()
    assert unnotified(engine) == []
    assert ([a.id for a in blocked.received], [a.id for a in recording.received]) == (
        [alert_id],
        [alert_id],
    )


def test_the_budget_leaves_alerts_for_the_next_dispatch(engine: Engine) -> None:
    """The sink takes the first alert at once and holds the second until the first dispatch's
    budget has passed: that dispatch marks one, the next the other. (Conditions, not sleeps:
    with a 0.4 s sink and a 0.6 s budget the first alert missed the budget once under load.)"""
    raise_alerts(engine, 2)
    release = threading.Event()

    class HoldingSink(RecordingSink):
        def send(self, alert: AlertRecord) -> None:
            if self.received:
                release.wait(30)
            super().send(alert)

    sink = HoldingSink()
    dispatcher = AlertDispatcher(engine, [sink], namespace="ns1")
    try:
        first = dispatcher.dispatch_pending(2.0)
        left = len(unnotified(engine))
        release.set()
        second = dispatcher.dispatch_pending(30)
    finally:
        release.set()
        dispatcher.stop()

    assert (first, left, second) == (1, 1, 1)
    assert len(sink.received) == 2


def test_the_background_thread_delivers_when_woken(engine: Engine) -> None:
    recording = RecordingSink()
    dispatcher = AlertDispatcher(engine, [recording], namespace="ns1", interval=30)
    dispatcher.start()
    try:
        harness.wait_for(lambda: unnotified(engine) == [], timeout=5, what="first idle round")
        ids = raise_alerts(engine, 2)
        started = time.monotonic()
        dispatcher.wake()
        harness.wait_for(lambda: unnotified(engine) == [], timeout=5, what="delivery")
    finally:
        dispatcher.stop()
    assert time.monotonic() - started < 5  # woken, not waiting for the 30 s interval
    assert [a.id for a in recording.received] == ids


def test_stop_does_not_wait_for_a_hung_sink(engine: Engine) -> None:
    """The supervisor's shutdown is bounded; the undelivered alert stays for next time."""
    [alert_id] = raise_alerts(engine, 1)
    blocked, recording = BlockedSink(), RecordingSink()
    dispatcher = AlertDispatcher(engine, [blocked, recording], namespace="ns1", budget=30)
    dispatcher.start()
    try:
        harness.wait_for(lambda: recording.received != [], timeout=5, what="the free sink")
        started = time.monotonic()
        dispatcher.stop(timeout=0.5)
        elapsed = time.monotonic() - started
    finally:
        blocked.release.set()
    assert elapsed < 1.5
    assert unnotified(engine) == [alert_id]


def test_a_database_outage_does_not_end_the_background_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = make_engine(f"postgresql+psycopg://postgres@127.0.0.1:{port}/nowhere", pool_size=1)
    dispatcher = AlertDispatcher(down, [RecordingSink()], namespace="ns1", interval=0.05)
    try:
        with caplog.at_level(logging.WARNING, logger="sasflow.supervisor.dispatch"):
            dispatcher.start()
            harness.wait_for(
                lambda: caplog.text.count("alerts not dispatched") >= 2,
                timeout=10,
                what="two failed rounds",
            )
            assert dispatcher._thread is not None
            assert dispatcher._thread.is_alive()
    finally:
        dispatcher.stop()
        down.dispose()


# --- (c) the alerts exchange -----------------------------------------------------------------


def test_exchange_sink_routes_by_kind_and_reconnects_after_losing_the_broker(
    engine: Engine, names: Names
) -> None:
    queue = f"{names.namespace}.test-alerts"
    with services.broker_channel() as channel:
        channel.exchange_declare(names.alerts, exchange_type=ExchangeType("topic"), durable=True)
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, names.alerts, routing_key="alert.step_failed")
    made: list[RabbitMQTransport] = []

    def factory() -> Transport:
        made.append(harness.transport("alerts"))
        return made[-1]

    raise_alerts(engine, 1, kind="stalled")  # not bound: must not arrive
    [failed] = raise_alerts(engine, 1)
    sink = ExchangeSink(factory, names)
    dispatcher = AlertDispatcher(engine, [sink], namespace=names.namespace)
    try:
        assert dispatcher.dispatch_pending(10) == 2
        made[0].close()  # the broker connection is gone
        sink.send(RECORD)
        got = harness.drain_json(queue, until=lambda m: len(m) >= 2, timeout=10)
    finally:
        dispatcher.stop()
        sink.close()

    assert [(m["_routing_key"], m["id"], m["namespace"]) for m in got] == [
        ("alert.step_failed", failed, names.namespace),
        ("alert.step_failed", 1, "test"),
    ]
    assert got[0]["_headers"] == {
        "x-sasflow-alert-id": failed,
        "x-sasflow-incident-id": got[0]["incident_id"],
    }
    assert len(made) == 2


# --- (d) e-mail ------------------------------------------------------------------------------


def test_email_sink_delivers_one_message_to_every_recipient() -> None:
    record = AlertRecord(**{**RECORD.__dict__, "message": "échec: step charge failed"})
    with smtp_server() as server:
        port = server.server_address[1]
        EmailSink(
            "127.0.0.1",
            port,
            "sasflow <alerts@example.org>",
            ["ops@example.org", "oncall@example.org"],
        ).send(record)

    [(sender, recipients, data)] = server.envelopes
    message = message_from_bytes(data, policy=policy.default)
    assert isinstance(message, EmailMessage)
    body = message.get_body(preferencelist=("plain",))
    assert body is not None
    text = body.get_content()
    assert (sender, recipients) == ("alerts@example.org", ["ops@example.org", "oncall@example.org"])
    assert message["Subject"] == "[sasflow] step_failed: échec: step charge failed"
    assert json.loads(text[text.index("{") :]) == json.loads(record.to_json())


def test_email_failure_raises_without_the_password(caplog: pytest.LogCaptureFixture) -> None:
    """The test server offers no AUTH: login fails, and the password shows nowhere."""
    hidden = "hunter2-" + "x"
    with smtp_server() as server, caplog.at_level(logging.DEBUG):
        sink = EmailSink(
            "127.0.0.1",
            server.server_address[1],
            "a@example.org",
            ["b@example.org"],
            username="mailer",
            password=hidden,
        )
        with pytest.raises(DeliveryError, match=r"smtp 127\.0\.0\.1") as failed:
            sink.send(RECORD)

    assert server.envelopes == []
    assert hidden not in str(failed.value)
    assert hidden not in caplog.text
