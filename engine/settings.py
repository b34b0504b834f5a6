"""Typed settings, read from SASFLOW_* variables at the edge (the CLI) and passed down."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sasflow.messages import DEFAULT_LIMITS, Limits
from sasflow.redact import redact_url

# The embedded default: a SQLite file in the working directory and the in-process bus, so that
# a fresh machine runs `sasflow demo` and `sasflow run` with no service. Production sets both.
DEFAULT_DATABASE_URL = "sqlite:///sasflow.db"
DEFAULT_BROKER_URL = "memory://"


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
        "process: sasflow demo, sasflow run).",
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
            "max_message_bytes": self.max_message_bytes,
            "max_json_depth": self.max_json_depth,
            "retain_completed_days": self.retain_completed_days,
            "retain_failed_days": self.retain_failed_days,
        }
