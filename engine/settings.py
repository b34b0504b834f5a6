"""Typed settings, read from SASFLOW_* variables at the edge (the CLI) and passed down."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sasflow.backpressure import DEFAULT_MAX_BACKLOG
from sasflow.messages import DEFAULT_LIMITS, Limits
from sasflow.redact import redact_url

# The embedded default: a SQLite file in the working directory and the in-process bus, so that
# a fresh machine runs `sasflow demo` and `sasflow run` with no service. Production sets both.
DEFAULT_DATABASE_URL = "sqlite:///sasflow.db"
DEFAULT_BROKER_URL = "memory://"
MIN_CALLBACK_KEY = 16
"""Characters an HMAC key of the callbacks needs at least (a guess must not be cheap)."""
MIN_AWAY_ALERT_S = 60.0
"""Seconds at least before a subscriber without a stream is alerted: well above a connected
one's heartbeat, which refreshes when it was seen."""


class Settings(BaseSettings):
    """Where the state store and broker are, which namespace to use and which app to load."""

    model_config = SettingsConfigDict(env_prefix="SASFLOW_", frozen=True, extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL of the state store: postgresql+psycopg://... (production) "
        "or sqlite:///PATH (one machine; the default is ./sasflow.db).",
    )
    broker_url: str = Field(
        default=DEFAULT_BROKER_URL,
        description="Broker URL: amqp://... or amqps://... for RabbitMQ, or memory:// for the "
        "in-process bus (the default; it only connects roles run as threads of one "
        "process: sasflow demo, sasflow run). For a RabbitMQ cluster, one URL per node "
        "separated by commas (whitespace around them ignored), tried in a new random order "
        "on every connect (docs/howto/connections-and-tls.md).",
    )
    namespace: str = Field(
        default="sasflow",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$",
        description="Prefix of every queue and exchange name.",
    )
    app: str | None = Field(
        default=None,
        description="Module (or module:attribute) holding the workflow and agent registry.",
    )

    alert_webhook_url: str | None = Field(
        default=None,
        description="URL the supervisor POSTs each alert's JSON to (http:// or https://).",
    )
    alert_smtp_host: str | None = Field(default=None, description="SMTP relay for alert e-mails.")
    alert_smtp_port: int = Field(default=25, ge=1, le=65535, description="SMTP relay port.")
    alert_smtp_username: str | None = Field(
        default=None, description="SMTP login (none: no login)."
    )
    alert_smtp_password: SecretStr | None = Field(default=None, description="SMTP password.")
    alert_smtp_starttls: bool = Field(
        default=False, description="Upgrade the SMTP connection with STARTTLS."
    )
    alert_email_from: str | None = Field(
        default=None, description="Sender address of alert e-mails."
    )
    alert_email_to: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Recipients of alert e-mails, comma-separated (a@x,b@y) or a JSON list.",
    )
    alert_exchange: bool = Field(
        default=True, description="Publish alerts to the <namespace>.alerts topic exchange."
    )
    alert_remind_s: float = Field(
        default=3600.0,
        ge=0,
        description="Seconds between 'still happening' notices of an open incident that "
        "counted new alerts since the sinks last heard of it (0: none; docs/alerts.md).",
    )

    # -- message limits (docs/protocol.md, section 3) ------------------------------------------
    max_message_bytes: int = Field(
        default=DEFAULT_LIMITS.max_message_bytes,
        ge=1024,
        description="Largest message body accepted (a submission, a request, a reply), in bytes; "
        "larger ones are dead-lettered or refused with this limit in the reason.",
    )
    max_json_depth: int = Field(
        default=DEFAULT_LIMITS.max_json_depth,
        ge=2,
        le=500,
        description="Deepest JSON nesting accepted in a message (the message's own object is "
        "level 1, a submission's input level 2).",
    )

    # -- backpressure at the doors (docs/backpressure.md) --------------------------------------
    max_backlog: int = Field(
        default=DEFAULT_MAX_BACKLOG,
        ge=0,
        description="Runs of one workflow that may wait to start (submitted, not started) "
        "before the doors push back: the HTTP API answers 429, the submitter leaves "
        "submissions in its queue; a workflow's own max_backlog wins. 0: no bound.",
    )

    def limits(self) -> Limits:
        """The message limits every role of this process parses within."""
        return Limits(max_message_bytes=self.max_message_bytes, max_json_depth=self.max_json_depth)

    # -- history retention (the supervisor, and `sasflow db prune` without --older-than) --------
    retain_completed_days: float = Field(
        default=30,
        ge=0,
        description="Days a completed run (its steps, events and alerts) is kept after it "
        "finished; 0 keeps completed runs forever.",
    )
    retain_failed_days: float = Field(
        default=90,
        ge=0,
        description="Days a run that finished without completing (error, compensation_failed, "
        "cancelled, compensated) is kept; 0 keeps them forever. A run with an open alert is "
        "kept until the alert is acknowledged.",
    )
    retain_audit_days: float = Field(
        default=365,
        ge=0,
        description="Days an audit record (sasflow audit list) is kept after it was written; "
        "0 keeps them forever.",
    )
    retain_dead_letters_days: float = Field(
        default=14,
        ge=0,
        description="Days a dead letter stays in <namespace>.dead; older ones are removed by "
        "the supervisor, each recorded (with its body, cut at 2,000 characters) in the audit "
        "trail, action dead.expire. 0 keeps them however old.",
    )
    retain_dead_letters_max: int = Field(
        default=10_000,
        ge=0,
        description="Dead letters <namespace>.dead holds at most; the oldest beyond it are "
        "removed by the supervisor as old ones are. 0: no bound.",
    )

    # -- connections: pools, timeouts, heartbeats, TLS (docs/howto/connections-and-tls.md) ----
    # TLS to PostgreSQL is libpq's, in the URL: ?sslmode=verify-full&sslrootcert=/path/ca.pem

    db_pool_size: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="Connections each process keeps in its pool [default: 5; the operator "
        "commands 1, sasflow run schedulers + 4].",
    )
    db_max_overflow: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="Connections opened beyond the pool under load [default: the pool size].",
    )
    db_pool_timeout: float = Field(
        default=30.0, gt=0, le=3600, description="Seconds to wait for a free pooled connection."
    )
    db_connect_timeout: int = Field(
        default=10, ge=1, le=600, description="Seconds to establish a database connection."
    )
    db_statement_timeout: float = Field(
        default=60.0,
        ge=0,
        le=86400,
        description="Seconds any one statement may run (0: no limit; migrations have none).",
    )
    broker_heartbeat: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="Seconds between AMQP heartbeats; a dead broker is noticed after about "
        "two (0: none).",
    )
    broker_connection_attempts: int = Field(
        default=1,
        ge=1,
        le=100,
        description="Attempts per broker connect (the roles also reconnect with backoff).",
    )
    broker_retry_delay: float = Field(
        default=2.0, ge=0, le=600, description="Seconds between those attempts."
    )
    broker_socket_timeout: float = Field(
        default=10.0, gt=0, le=600, description="Seconds to open the broker's TCP connection."
    )
    broker_blocked_connection_timeout: float = Field(
        default=60.0,
        ge=0,
        le=86400,
        description="Seconds the broker may block publishers (memory or disk alarm) before "
        "the connection is dropped and reconnected (0: wait for ever).",
    )
    broker_ca_file: str | None = Field(
        default=None,
        description="CA bundle (PEM) verifying the broker's certificate, amqps:// only "
        "[default: the system's CAs].",
    )
    broker_cert_file: str | None = Field(
        default=None,
        description="Client certificate (PEM) for amqps://, when the broker asks for one.",
    )
    broker_key_file: str | None = Field(
        default=None, description="Private key of the client certificate [default: in it]."
    )

    broker_queue_type: Literal["classic", "quorum"] = Field(
        default="classic",
        description="Type of the durable work queues (submit, replies, agent and pool "
        "queues, dead letters): classic, or quorum (replicated; the production choice on a "
        "RabbitMQ cluster). An existing deployment changes type with `sasflow queues "
        "migrate` (docs/howto/production-topology.md).",
    )
    broker_quorum_replicas: int | None = Field(
        default=None,
        ge=1,
        le=99,
        description="Replicas of each new quorum queue [default: the broker's].",
    )
    broker_delivery_limit: int = Field(
        default=10,
        ge=0,
        le=10_000,
        description="Quorum queues: deliveries of one message before the broker dead-letters "
        "it (a request that crashes every agent ends as a counted failure); 0: no limit.",
    )

    broker_consumer_timeout: float = Field(
        default=1800.0,
        ge=0,
        le=7 * 86400,
        description="The broker's consumer timeout in seconds (RabbitMQ's `consumer_timeout`, "
        "30 min by default; 0: none). An agent acknowledges the request of a step whose "
        "execution budget is at least half of it when the step starts instead of after "
        "its reply, so the broker never closes the channel and redelivers it mid-step "
        "(docs/timeouts.md).",
    )

    # -- end of connections -----------------------------------------------------------------

    # -- the HTTP API (sasflow api, docs/api.md) -------------------------------------------------
    api_host: str = Field(default="127.0.0.1", description="Address `sasflow api` listens on.")
    api_port: int = Field(default=8080, ge=0, le=65535, description="Port of `sasflow api`.")
    api_max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Largest request body the HTTP API accepts, in bytes (larger: 413).",
    )
    api_max_json_depth: int = Field(
        default=DEFAULT_LIMITS.max_json_depth,
        ge=2,
        le=500,
        description="Deepest JSON nesting the HTTP API accepts in a request body (deeper: 400).",
    )
    api_body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds the HTTP API waits for a request's whole body (slower: 408, and "
        "the connection is closed).",
    )
    api_header_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds the HTTP API waits for a request's head (request line and "
        "headers) from the connection's start or the head's first byte (slower: 408, and the "
        "connection is closed).",
    )
    api_ssl_certfile: str | None = Field(
        default=None, description="Certificate (PEM) to serve the HTTP API over TLS."
    )
    api_ssl_keyfile: str | None = Field(
        default=None, description="Private key (PEM) of that certificate [default: in it]."
    )
    api_callback_secret: SecretStr | None = Field(
        default=None,
        description="Key of the HMAC-SHA256 signature of outgoing callbacks, at least 16 "
        "characters; without it the API refuses runs with a callback_url (every API server "
        "needs the same key).",
    )
    api_callback_give_up_s: float = Field(
        default=86400,
        gt=0,
        description="Seconds after a run ended that its callback is given up (failed, alert).",
    )
    api_callback_max_attempts: int = Field(
        default=1024, ge=1, description="Delivery attempts before a callback is given up."
    )
    api_callback_backoff_initial_s: float = Field(
        default=1.0, gt=0, description="Seconds before the first retry of a failed callback."
    )
    api_callback_backoff_max_s: float = Field(
        default=600.0, gt=0, description="Longest wait between two attempts of a callback."
    )
    api_callback_timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="Seconds one callback POST may take."
    )
    api_callback_poll_s: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="Seconds between two looks of the callback loop for due callbacks.",
    )
    api_callbacks: bool = Field(
        default=True,
        description="Run the callback delivery loop in this API server (several servers "
        "share the work safely).",
    )
    api_session_secret: SecretStr | None = Field(
        default=None,
        description="Key that signs the console's session cookies (at least 16 characters; "
        "give every API server of a cluster the same one). Unset: a random key per server "
        "process, so sessions end when it restarts.",
    )

    # -- agent pools (the scheduler) ------------------------------------------------------------
    pool_give_up_s: float = Field(
        default=86400,
        gt=0,
        description="Seconds a step waits for a live agent of its pool before it fails with "
        "'no agent in pool P'.",
    )
    pool_max_looks: int = Field(
        default=1024,
        ge=1,
        description="Dispatch passes that find no agent in a step's pool before it fails.",
    )

    # -- the HTTP API's subscription stream (docs/api-stream.md) -------------------------------
    api_stream_heartbeat_s: float = Field(
        default=15.0,
        gt=0,
        le=3600,
        description="Seconds between HEARTBEAT records on a subscription stream (clients call "
        "a stream dead after 5 missed).",
    )
    api_stream_resend_s: float = Field(
        default=30.0,
        gt=0,
        le=86400,
        description="Seconds after which an UPDATE sent but not acknowledged is sent again on "
        "the same stream (a reconnection re-sends every unacknowledged one at once).",
    )
    api_stream_away_alert_s: float = Field(
        default=86400,
        ge=0,
        description="Seconds a subscriber may have no open stream before the supervisor "
        "raises a subscriber_away alert; 0: no alert, and no expiry.",
    )
    api_stream_expire_s: float = Field(
        default=7 * 86400,
        ge=0,
        description="Seconds without an open stream after which the supervisor deletes a "
        "subscriber with its unacknowledged updates (audited: stream.expire), and no sooner "
        "than this minus the alert's delay after its subscriber_away alert; 0 keeps "
        "subscribers forever.",
    )

    @model_validator(mode="after")
    def _alert_before_expiry(self) -> Settings:
        expire, alert = self.api_stream_expire_s, self.api_stream_away_alert_s
        if expire and not 0 < alert < expire:
            raise ValueError(
                "SASFLOW_API_STREAM_AWAY_ALERT_S must be above 0 and below "
                f"SASFLOW_API_STREAM_EXPIRE_S ({expire:g}): a subscriber is alerted before it "
                "expires (or set SASFLOW_API_STREAM_EXPIRE_S=0 to keep subscribers forever)"
            )
        if alert and alert < MIN_AWAY_ALERT_S:
            raise ValueError(
                f"SASFLOW_API_STREAM_AWAY_ALERT_S must be at least {MIN_AWAY_ALERT_S:g} "
                "seconds (a connected subscriber is seen at each heartbeat)"
            )
        return self

    @field_validator("api_callback_secret", "api_session_secret")
    @classmethod
    def _long_enough_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_CALLBACK_KEY:
            raise ValueError(f"the key needs at least {MIN_CALLBACK_KEY} characters")
        return value

    # -- observability (docs/observability.md) -----------------------------------------------
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="Log lines as text, or as one JSON object per line (timestamp, level, role, "
        "run/step/attempt ids when known, trace id).",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port on which a role serves Prometheus /metrics [default: off]; 0 picks a "
        "free port (logged). Needs the sasflow[metrics] extra.",
    )
    metrics_address: str = Field(
        default="127.0.0.1",
        description="Address the /metrics server listens on (0.0.0.0: every interface).",
    )
    trace_file: str | None = Field(
        default=None,
        description="Turn OpenTelemetry tracing on and append this process's spans to this "
        "file as JSON lines [default: tracing off]. Needs the sasflow[otel] extra.",
    )

    @field_validator("alert_email_to", mode="before")
    @classmethod
    def _split_recipients(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    def redacted(self) -> dict[str, Any]:
        """The settings as a mapping, passwords replaced by ***."""
        return {
            "database_url": redact_url(self.database_url),
            "broker_url": redact_url(self.broker_url),
            "namespace": self.namespace,
            "app": self.app,
            "alert_webhook_url": redact_url(self.alert_webhook_url)
            if self.alert_webhook_url
            else None,
            "alert_smtp_host": self.alert_smtp_host,
            "alert_smtp_port": self.alert_smtp_port,
            "alert_smtp_username": self.alert_smtp_username,
            "alert_smtp_password": "***" if self.alert_smtp_password is not None else None,
            "alert_smtp_starttls": self.alert_smtp_starttls,
            "alert_email_from": self.alert_email_from,
            "alert_email_to": list(self.alert_email_to),
            "alert_exchange": self.alert_exchange,
            "alert_remind_s": self.alert_remind_s,
            "max_message_bytes": self.max_message_bytes,
            "max_json_depth": self.max_json_depth,
            "max_backlog": self.max_backlog,
            "retain_completed_days": self.retain_completed_days,
            "retain_failed_days": self.retain_failed_days,
            "retain_audit_days": self.retain_audit_days,
            "retain_dead_letters_days": self.retain_dead_letters_days,
            "retain_dead_letters_max": self.retain_dead_letters_max,
            "api_stream_heartbeat_s": self.api_stream_heartbeat_s,
            "api_stream_resend_s": self.api_stream_resend_s,
            "api_stream_away_alert_s": self.api_stream_away_alert_s,
            "api_stream_expire_s": self.api_stream_expire_s,
            **{name: getattr(self, name) for name in CONNECTION_SETTINGS},
            **{name: getattr(self, name) for name in API_SETTINGS},
            "api_callback_secret": "***" if self.api_callback_secret is not None else None,
            "api_session_secret": "***" if self.api_session_secret is not None else None,
        }


CONNECTION_SETTINGS = (
    "db_pool_size",
    "db_max_overflow",
    "db_pool_timeout",
    "db_connect_timeout",
    "db_statement_timeout",
    "broker_heartbeat",
    "broker_connection_attempts",
    "broker_retry_delay",
    "broker_socket_timeout",
    "broker_blocked_connection_timeout",
    "broker_ca_file",
    "broker_cert_file",
    "broker_key_file",
)
"""Settings that hold no secret (file paths, not contents): shown as they are."""

API_SETTINGS = (
    "api_host",
    "api_port",
    "api_max_body_bytes",
    "api_max_json_depth",
    "api_body_timeout_s",
    "api_header_timeout_s",
    "api_ssl_certfile",
    "api_ssl_keyfile",
    "api_callback_give_up_s",
    "api_callback_max_attempts",
    "api_callback_backoff_initial_s",
    "api_callback_backoff_max_s",
    "api_callback_timeout_s",
    "api_callback_poll_s",
    "api_callbacks",
    "pool_give_up_s",
    "pool_max_looks",
)
"""The HTTP API's and the pools' settings that hold no secret."""
