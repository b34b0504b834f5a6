"""Alert sinks without services: the JSON document, the e-mail, which sinks the settings
select, redaction of secrets, and the exchange sink's reconnection (on a fake transport)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from email import message_from_bytes, policy
from types import SimpleNamespace

import pydantic
import pytest

from sasflow.errors import BrokerUnavailableError, ConfigurationError
from sasflow.settings import Settings
from sasflow.supervisor.sinks import (
    AlertRecord,
    EmailSink,
    ExchangeSink,
    LogSink,
    WebhookSink,
    build_email,
    build_sinks,
    email_subject,
)
from sasflow.transport.base import Delivery, Outgoing, Transport
from sasflow.transport.topology import Names

RECORD = AlertRecord(
    id=42,
    kind="step_failed",
    message="step charge of run 7 failed: déclin",
    run_id=7,
    step_id=19,
    detail={"error": {"type": "Timeout"}, "attempt": 3},
    created_at="2025-01-31T12:00:00.123456+00:00",
    namespace="prod",
    incident_id=5,
    count=100,
    cause="step_failed in order at step 'charge': Timeout: ",
    workflow="order",
    business_key="o-1",
)

HIDDEN = "hunter2"
"""A password the tests make sure is never shown."""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No SASFLOW_* variable from the surrounding environment leaks into a test."""
    for name in list(os.environ):
        if name.upper().startswith("SASFLOW_"):
            monkeypatch.delenv(name)
    return monkeypatch


class FakeTransport:
    """Records what the exchange sink does; `fail_next_publish` simulates a lost broker."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.published: list[Outgoing] = []
        self.fail_next_publish = False
        self.connected = False

    @property
    def generation(self) -> int:
        return 1

    def connect(self) -> None:
        self.connected = True
        self.log.append("connect")

    def close(self) -> None:
        self.connected = False
        self.log.append("close")

    def declare_exchange(self, name: str, kind: str) -> None:
        self.log.append(f"declare {name} {kind}")

    def declare_queue(
        self,
        name: str,
        *,
        dead_letter_exchange: str | None,
        max_length: int | None = None,
        expires_ms: int | None = None,
        work: bool = False,
    ) -> None:
        raise NotImplementedError

    def bind_queue(self, queue: str, exchange: str, routing_key: str) -> None:
        raise NotImplementedError

    def consumer_count(self, queue: str) -> int:
        raise NotImplementedError

    def message_count(self, queue: str) -> int:
        raise NotImplementedError

    def consume(self, queue: str, handler: Callable[[Delivery], None], *, prefetch: int) -> None:
        raise NotImplementedError

    def cancel_consumers(self, queue: str | None = None) -> None:
        raise NotImplementedError

    def get(self, queue: str) -> Delivery | None:
        raise NotImplementedError

    def publish(self, message: Outgoing) -> None:
        if self.fail_next_publish:
            self.fail_next_publish = False
            raise BrokerUnavailableError("connection reset")
        self.published.append(message)

    def publish_many(self, messages: Sequence[Outgoing]) -> list[Exception | None]:
        raise NotImplementedError

    def ack(self, delivery: Delivery, *, multiple: bool = False) -> bool:
        raise NotImplementedError

    def dead_letter(self, delivery: Delivery, reason: str, *, dead_letter_exchange: str) -> None:
        raise NotImplementedError

    def requeue(self, delivery: Delivery) -> bool:
        raise NotImplementedError

    def process(self, time_limit: float) -> None:  # noqa: ARG002 - the Transport signature
        if not self.connected:
            raise BrokerUnavailableError("not connected")

    def call_threadsafe(self, callback: Callable[[], None]) -> None:
        raise NotImplementedError


def _factory(made: list[FakeTransport], log: list[str]) -> Callable[[], Transport]:
    def make() -> Transport:
        made.append(FakeTransport(log))
        return made[-1]

    return make


def test_alert_json_has_every_field_with_its_value() -> None:
    """The document carries the alert's fields and the namespace, non-ASCII kept as is."""
    document = json.loads(RECORD.to_json())

    assert document == {
        "id": 42,
        "kind": "step_failed",
        "message": "step charge of run 7 failed: déclin",
        "run_id": 7,
        "step_id": 19,
        "detail": {"error": {"type": "Timeout"}, "attempt": 3},
        "created_at": "2025-01-31T12:00:00.123456+00:00",
        "namespace": "prod",
        "incident_id": 5,
        "count": 100,
        "cause": "step_failed in order at step 'charge': Timeout: ",
        "workflow": "order",
        "business_key": "o-1",
    }
    assert "déclin" in RECORD.to_json()


def test_alert_record_from_a_row_without_run_renders_nulls_and_an_iso_time() -> None:
    """An alert not tied to a run (e.g. stalled) has null run and step ids."""
    row = SimpleNamespace(
        id=3,
        kind="stalled",
        message="m",
        run_id=None,
        step_id=None,
        detail=None,
        created_at=datetime(2025, 2, 1, 8, 30, tzinfo=UTC),
        incident_id=4,
        incident_count=1,
        incident_cause="stalled of echo",
        workflow=None,
        business_key=None,
    )

    document = json.loads(AlertRecord.from_row(row, "ns").to_json())

    assert (
        document["run_id"],
        document["step_id"],
        document["detail"],
        document["created_at"],
        document["workflow"],
        document["business_key"],
        document["incident_id"],
        document["count"],
    ) == (None, None, None, "2025-02-01T08:30:00+00:00", None, None, 4, 1)


def test_email_subject_is_kind_and_first_80_characters_on_one_line() -> None:
    """The subject holds the kind, its incident's count when more than one, and at most 80
    characters of the message, no line breaks."""
    long = AlertRecord(**{**RECORD.__dict__, "message": "line one\nline two " + "x" * 200})

    subject = email_subject(long)

    assert subject == "[sasflow] step_failed (100 alerts): line one line two " + "x" * 62
    assert "\n" not in subject
    alone = AlertRecord(**{**long.__dict__, "count": 1})
    assert email_subject(alone) == "[sasflow] step_failed: line one line two " + "x" * 62


def test_email_message_has_headers_and_the_json_in_a_plain_text_body() -> None:
    """From, To, Subject are set; the plain-text body ends with the alert's JSON."""
    alone = AlertRecord(**{**RECORD.__dict__, "count": 1})  # the subject without a count
    built = build_email(alone, "sasflow <alerts@example.org>", ["a@example.org", "b@x.org"])

    parsed = message_from_bytes(built.as_bytes(), policy=policy.default)
    body = parsed.get_body(preferencelist=("plain",))
    assert body is not None
    text = body.get_content()
    assert (parsed["From"], parsed["To"], parsed["Subject"]) == (
        "sasflow <alerts@example.org>",
        "a@example.org, b@x.org",
        "[sasflow] step_failed: step charge of run 7 failed: déclin",
    )
    assert parsed.get_content_type() == "text/plain"
    assert parsed["Message-ID"].endswith("@example.org>")
    assert json.loads(text[text.index("{") :]) == json.loads(alone.to_json())


def test_email_sink_needs_a_recipient() -> None:
    with pytest.raises(ConfigurationError, match="recipient"):
        EmailSink("smtp.example.org", 25, "a@example.org", [])


def test_default_settings_select_the_log_and_exchange_sinks(clean_env: pytest.MonkeyPatch) -> None:
    sinks = build_sinks(Settings(), _factory([], []))

    assert [type(s) for s in sinks] == [LogSink, ExchangeSink]


def test_every_configured_sink_is_selected(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings(
        alert_webhook_url="https://hooks.example.org/T/secret",
        alert_smtp_host="smtp.example.org",
        alert_email_from="a@example.org",
        alert_email_to=["ops@example.org"],
        alert_smtp_starttls=True,
    )

    sinks = build_sinks(settings, _factory([], []))

    assert [s.name for s in sinks] == ["log", "webhook", "email", "exchange"]


def test_email_needs_host_sender_and_recipients(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A partial e-mail configuration selects no e-mail sink, and says why."""
    settings = Settings(
        alert_smtp_host="smtp.example.org", alert_email_from="a@example.org", alert_exchange=False
    )

    with caplog.at_level(logging.WARNING):
        sinks = build_sinks(settings, _factory([], []))

    assert [s.name for s in sinks] == ["log"]
    assert "SASFLOW_ALERT_EMAIL_TO" in caplog.text


def test_recipients_are_read_comma_separated_or_as_json(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SASFLOW_ALERT_EMAIL_TO", "a@x.org, b@y.org,")
    comma = Settings().alert_email_to
    clean_env.setenv("SASFLOW_ALERT_EMAIL_TO", '["c@z.org"]')
    listed = Settings().alert_email_to

    assert (comma, listed) == (["a@x.org", "b@y.org"], ["c@z.org"])


def test_alert_settings_are_read_from_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SASFLOW_ALERT_SMTP_PORT", "587")
    clean_env.setenv("SASFLOW_ALERT_SMTP_STARTTLS", "true")
    clean_env.setenv("SASFLOW_ALERT_EXCHANGE", "false")
    clean_env.setenv("SASFLOW_ALERT_SMTP_PASSWORD", "hunter2")

    settings = Settings()

    assert (settings.alert_smtp_port, settings.alert_smtp_starttls, settings.alert_exchange) == (
        587,
        True,
        False,
    )
    assert settings.alert_smtp_password is not None
    assert settings.alert_smtp_password.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(settings)


def test_invalid_smtp_port_is_rejected(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SASFLOW_ALERT_SMTP_PORT", "70000")

    with pytest.raises(pydantic.ValidationError, match="alert_smtp_port"):
        Settings()


def test_redacted_hides_the_smtp_password_and_webhook_url_password(
    clean_env: pytest.MonkeyPatch,
) -> None:
    settings = Settings(
        alert_webhook_url="https://bot:s3cret@hooks.example.org/x",
        alert_smtp_password=HIDDEN,
        alert_smtp_username="mailer",
        alert_email_to=["ops@example.org"],
    )

    shown = settings.redacted()

    assert (
        shown["alert_webhook_url"],
        shown["alert_smtp_password"],
        shown["alert_smtp_username"],
        shown["alert_email_to"],
    ) == ("https://bot:***@hooks.example.org/x", "***", "mailer", ["ops@example.org"])
    assert "hunter2" not in json.dumps(shown)
    assert "s3cret" not in json.dumps(shown)


def test_sinks_do_not_show_secrets_in_repr_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    """The webhook is named by scheme, host and port; the SMTP password appears nowhere."""
    webhook = WebhookSink("https://bot:s3cret@hooks.example.org:8443/services/T0K3N?x=1")
    with caplog.at_level(logging.WARNING):
        email = EmailSink(
            "smtp.example.org",
            25,
            "a@example.org",
            ["b@example.org"],
            username="mailer",
            password=HIDDEN,
        )

    assert webhook.where == "https://hooks.example.org:8443"
    assert "s3cret" not in repr(webhook)
    assert "T0K3N" not in repr(webhook)
    assert "hunter2" not in repr(email)
    assert "without STARTTLS" in caplog.text
    assert "hunter2" not in caplog.text


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://example.org/x",
        "hooks.example.org",
        "http://",
        "https://u:s3cret@host:99999/x",
    ],
)
def test_webhook_accepts_only_http_urls(url: str) -> None:
    with pytest.raises(ConfigurationError, match="webhook") as refused:
        WebhookSink(url)

    assert "s3cret" not in str(refused.value)


def test_log_sink_logs_the_alert_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="sasflow.alerts"):
        LogSink().send(RECORD)

    assert [(r.name, r.levelno) for r in caplog.records] == [("sasflow.alerts", logging.WARNING)]
    assert "alert 42 step_failed" in caplog.text


def test_exchange_sink_publishes_to_the_alerts_exchange_by_kind() -> None:
    made: list[FakeTransport] = []
    calls: list[str] = []
    sink = ExchangeSink(_factory(made, calls), Names("prod"))

    sink.send(RECORD)
    sink.send(RECORD)

    published = made[0].published
    assert calls == ["connect", "declare prod.alerts topic"]  # one connection, kept
    assert [(m.exchange, m.routing_key) for m in published] == [
        ("prod.alerts", "alert.step_failed")
    ] * 2
    assert json.loads(published[0].body) == json.loads(RECORD.to_json())


def test_exchange_sink_raises_when_the_broker_is_lost_and_reconnects_on_the_next_send() -> None:
    made: list[FakeTransport] = []
    calls: list[str] = []
    sink = ExchangeSink(_factory(made, calls), Names("prod"))
    sink.send(RECORD)
    made[0].fail_next_publish = True

    with pytest.raises(BrokerUnavailableError):
        sink.send(RECORD)
    sink.send(RECORD)

    assert calls == [
        "connect",
        "declare prod.alerts topic",
        "close",
        "connect",
        "declare prod.alerts topic",
    ]
    assert (len(made[0].published), len(made[1].published)) == (1, 1)


def test_exchange_sink_replaces_a_connection_closed_while_idle() -> None:
    made: list[FakeTransport] = []
    sink = ExchangeSink(_factory(made, []), Names("prod"))
    sink.send(RECORD)
    made[0].connected = False  # the broker closed it (missed heartbeats)

    sink.send(RECORD)

    assert [len(t.published) for t in made] == [1, 1]
