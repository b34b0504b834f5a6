"""Where alerts go: the log, a webhook, e-mail and the `<ns>.alerts` exchange.

Every sink sends the same JSON document (`AlertRecord.to_json()`), UTF-8 encoded:

```jsonc
{
  "id": 42,                                   // alerts.id, unique per database
  "kind": "step_failed",       // step_failed | compensation_failed | stalled | scheduler_overloaded
  "message": "run 7 of order (key o-1) failed at step 'charge': PermanentError: declined",
  "run_id": 7,                                // or null
  "step_id": 19,                              // or null
  "detail": {"...": "..."},                   // kind-specific JSON, or null
  "created_at": "2025-01-31T12:00:00.123456+00:00",  // ISO 8601, database clock
  "namespace": "sasflow",                     // SASFLOW_NAMESPACE of the deployment
  "incident_id": 5,                           // its incident (docs/alerts.md#incidents)
  "count": 100,                               // the incident's alerts when this was sent
  "cause": "step_failed in order at step 'charge': PermanentError: declined",
  "workflow": "order",                        // the run's, or null
  "business_key": "o-1"                       // the run's, or null
}
```

Delivery is at least once: a receiver that must not act twice dedupes on
(`namespace`, `id`). A sink's `send` either returns (delivered) or raises (failed); the
dispatcher (`sasflow.supervisor.dispatch`) logs failures and carries on. Sinks never log
passwords: the webhook is named by scheme, host and port only, the SMTP password is not in
any message or repr.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import smtplib
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any, Protocol, runtime_checkable

from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential,
)

from sasflow.errors import ConfigurationError, SasflowError
from sasflow.redact import redact_url
from sasflow.settings import Settings
from sasflow.transport.base import Outgoing, Transport
from sasflow.transport.topology import Names

log = logging.getLogger(__name__)
alert_log = logging.getLogger("sasflow.alerts")
"""The log sink's logger: route it on its own to page from the log pipeline."""

SUBJECT_MESSAGE_CHARS = 80
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
ALERT_ID_HEADER = "x-sasflow-alert-id"
INCIDENT_ID_HEADER = "x-sasflow-incident-id"


class DeliveryError(SasflowError):
    """A sink could not deliver an alert."""

    def __init__(self, message: str | None = None, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class AlertRecord:
    """One raised alert as the sinks see it (a row of `alerts` plus the namespace)."""

    id: int
    kind: str
    message: str
    run_id: int | None
    step_id: int | None
    detail: Any
    created_at: str
    namespace: str
    incident_id: int | None = None
    """The incident the alert belongs to (an incident's first alert is the one sent)."""
    count: int | None = None
    """How many alerts the incident counted when this was sent."""
    cause: str | None = None
    """The incident's cause, readable (docs/alerts.md#incidents)."""
    workflow: str | None = None
    business_key: str | None = None
    """The alert's run's workflow and business key; null when it is about no run."""

    @classmethod
    def from_row(cls, row: Any, namespace: str) -> AlertRecord:
        return cls(
            id=row.id,
            kind=row.kind,
            message=row.message,
            run_id=row.run_id,
            step_id=row.step_id,
            detail=row.detail,
            created_at=row.created_at.isoformat(),
            namespace=namespace,
            incident_id=row.incident_id,
            count=row.incident_count,
            cause=row.incident_cause,
            workflow=row.workflow,
            business_key=row.business_key,
        )

    def to_json(self, indent: int | None = None) -> str:
        """The document every sink sends (see the module docstring)."""
        return json.dumps(asdict(self), ensure_ascii=False, indent=indent)


class Sink(Protocol):
    """Delivers one alert; returns when delivered, raises when it could not."""

    name: str

    def send(self, alert: AlertRecord) -> None: ...


@runtime_checkable
class Closable(Protocol):
    """A sink holding a connection, closed by the thread that used it."""

    def close(self) -> None: ...


class LogSink:
    """Logs each alert at WARNING on the `sasflow.alerts` logger."""

    name = "log"

    def send(self, alert: AlertRecord) -> None:
        alert_log.warning(
            "alert %d %s: %s (run %s, step %s, incident %s, count %s)",
            alert.id,
            alert.kind,
            alert.message,
            alert.run_id,
            alert.step_id,
            alert.incident_id,
            alert.count,
        )


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    # urllib would turn a redirected POST into a GET without the alert and call it a success.
    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


class WebhookSink:
    """POSTs the JSON document to `url`; any status but 2xx is a failure.

    Connection errors, timeouts, 408, 425, 429 and 5xx are retried with exponential backoff
    (`backoff`, doubling); no attempt starts and no wait ends past `total_timeout` seconds
    after the first attempt. Credentials in the URL (https://user:pw@host/...) are sent as
    HTTP basic authentication.
    """

    name = "webhook"

    def __init__(
        self,
        url: str,
        timeout: float = 5,
        attempts: int = 3,
        *,
        backoff: float = 0.5,
        total_timeout: float = 30.0,
    ) -> None:
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ConfigurationError(f"alert webhook URL {redact_url(url)!r}: {exc}") from None
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ConfigurationError(
                f"alert webhook URL {redact_url(url)!r} is not an http:// or https:// URL"
            )
        if attempts < 1 or timeout <= 0 or total_timeout <= 0:
            raise ConfigurationError(
                "alert webhook: attempts, timeout and total_timeout must be positive"
            )
        self._headers = {"Content-Type": "application/json", "User-Agent": "sasflow"}
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        netloc = host if port is None else f"{host}:{port}"
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
        self._url = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
        self.where = f"{parts.scheme}://{netloc}"
        """Scheme, host and port: what logs show (paths and queries often hold tokens)."""
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.total_timeout = total_timeout
        self._opener = urllib.request.build_opener(_RefuseRedirects())

    def __repr__(self) -> str:
        return f"WebhookSink({self.where!r})"

    def send(self, alert: AlertRecord) -> None:
        body = alert.to_json().encode("utf-8")
        deadline = time.monotonic() + self.total_timeout
        retrying = Retrying(
            stop=stop_after_attempt(self.attempts) | stop_before_delay(self.total_timeout),
            wait=wait_exponential(multiplier=self.backoff, max=self.total_timeout),
            retry=retry_if_exception(lambda e: isinstance(e, DeliveryError) and e.retryable),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                self._post(
                    body,
                    max(0.1, min(self.timeout, deadline - time.monotonic())),
                    attempt.retry_state.attempt_number,
                )

    def _post(self, body: bytes, timeout: float, number: int) -> None:
        # The scheme was checked in __init__: only http and https reach urlopen.
        request = urllib.request.Request(  # noqa: S310
            self._url,
            data=body,
            headers=self._headers,
            method="POST",
        )
        what = f"webhook {self.where} (attempt {number}/{self.attempts})"
        try:
            with self._opener.open(request, timeout=timeout) as response:
                status = int(response.status)
                response.read(65536)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise DeliveryError(
                f"{what}: HTTP {exc.code} {exc.reason}", retryable=exc.code in RETRYABLE_STATUS
            ) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise DeliveryError(f"{what}: {reason!r}", retryable=True) from None
        if not 200 <= status < 300:
            raise DeliveryError(f"{what}: HTTP {status}", retryable=status in RETRYABLE_STATUS)


def email_subject(alert: AlertRecord) -> str:
    """`[sasflow] <kind>: <first 80 characters of the message>` on one line; `<kind> (<count>
    alerts)` when its incident counted more than one."""
    counted = f" ({alert.count} alerts)" if alert.count is not None and alert.count > 1 else ""
    return " ".join(
        f"[sasflow] {alert.kind}{counted}: {alert.message[:SUBJECT_MESSAGE_CHARS]}".split()
    )


def build_email(alert: AlertRecord, sender: str, recipients: Sequence[str]) -> EmailMessage:
    """The plain-text message of one alert: its message, then the JSON document."""
    message = EmailMessage()
    message["Subject"] = email_subject(alert)
    message["From"] = sender
    message["To"] = ", ".join(recipients)
    message["Date"] = formatdate(usegmt=True)
    domain = sender.rpartition("@")[2].strip("> ") or "sasflow.invalid"
    # Stable across resends of the same alert, so mail clients can deduplicate.
    message["Message-ID"] = f"<sasflow-alert-{alert.namespace}-{alert.id}@{domain}>"
    message.set_content(f"{alert.message}\n\n{alert.to_json(indent=2)}\n")
    return message


class EmailSink:
    """Sends each alert as one e-mail through an SMTP relay (optionally STARTTLS and login)."""

    name = "email"

    def __init__(
        self,
        host: str,
        port: int,
        sender: str,
        recipients: Sequence[str],
        *,
        username: str | None = None,
        password: str | None = None,
        starttls: bool = False,
        timeout: float = 10,
    ) -> None:
        if not recipients:
            raise ConfigurationError("alert e-mail needs at least one recipient")
        self.host = host
        self.port = port
        self.sender = sender
        self.recipients = tuple(recipients)
        self.username = username
        self._password = password
        self.starttls = starttls
        self.timeout = timeout
        if username and not starttls:
            log.warning(
                "alert e-mail: logging in to %s:%d without STARTTLS sends the password in clear",
                host,
                port,
            )

    def __repr__(self) -> str:
        return f"EmailSink({self.host!r}, {self.port}, {self.sender!r}, {list(self.recipients)})"

    def send(self, alert: AlertRecord) -> None:
        message = build_email(alert, self.sender, self.recipients)
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout) as smtp:
                if self.starttls:
                    smtp.starttls(context=ssl.create_default_context())
                if self.username:
                    smtp.login(self.username, self._password or "")
                refused = smtp.send_message(message)
        except (smtplib.SMTPException, OSError) as exc:
            raise DeliveryError(f"smtp {self.host}:{self.port}: {exc!r}") from None
        if refused:
            log.warning(
                "alert %d: smtp %s:%d refused %s",
                alert.id,
                self.host,
                self.port,
                ", ".join(sorted(refused)),
            )


class ExchangeSink:
    """Publishes to the `<ns>.alerts` topic exchange with routing key `alert.<kind>`.

    The connection is opened on the first send and kept; a connection the broker closed
    meanwhile, or one a publish failed on, is replaced on the next send. Only the thread
    that sends may close it (pika connections have one owner thread).
    """

    name = "exchange"

    def __init__(self, transport_factory: Callable[[], Transport], names: Names) -> None:
        self._factory = transport_factory
        self._names = names
        self._transport: Transport | None = None

    def send(self, alert: AlertRecord) -> None:
        transport = self._connected()
        try:
            transport.publish(
                Outgoing(
                    exchange=self._names.alerts,
                    routing_key=f"alert.{alert.kind}",
                    body=alert.to_json().encode("utf-8"),
                    headers={ALERT_ID_HEADER: alert.id}
                    | (
                        {} if alert.incident_id is None else {INCIDENT_ID_HEADER: alert.incident_id}
                    ),
                )
            )
        except SasflowError:
            self.close()
            raise

    def _connected(self) -> Transport:
        if self._transport is not None:
            try:
                # Services heartbeats, and notices a connection the broker closed while idle.
                self._transport.process(0)
            except SasflowError as exc:
                log.info("alert exchange: reconnecting (%s)", exc)
                self.close()
            else:
                return self._transport
        transport = self._factory()
        try:
            transport.connect()
            transport.declare_exchange(self._names.alerts, "topic")
        except SasflowError:
            transport.close()
            raise
        self._transport = transport
        return transport

    def close(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()


def build_sinks(settings: Settings, transport_factory: Callable[[], Transport]) -> list[Sink]:
    """The sinks the settings ask for; the log sink always."""
    sinks: list[Sink] = [LogSink()]
    if settings.alert_webhook_url:
        sinks.append(WebhookSink(settings.alert_webhook_url))
    if settings.alert_smtp_host and settings.alert_email_from and settings.alert_email_to:
        password = settings.alert_smtp_password
        sinks.append(
            EmailSink(
                settings.alert_smtp_host,
                settings.alert_smtp_port,
                settings.alert_email_from,
                settings.alert_email_to,
                username=settings.alert_smtp_username,
                password=password.get_secret_value() if password is not None else None,
                starttls=settings.alert_smtp_starttls,
            )
        )
    elif settings.alert_smtp_host or settings.alert_email_from or settings.alert_email_to:
        log.warning(
            "alert e-mail disabled: it needs SASFLOW_ALERT_SMTP_HOST, "
            "SASFLOW_ALERT_EMAIL_FROM and SASFLOW_ALERT_EMAIL_TO"
        )
    if settings.alert_exchange:
        sinks.append(ExchangeSink(transport_factory, Names(settings.namespace)))
    return sinks
