"""Typed settings, read from SASFLOW_* variables at the edge (the CLI) and passed down."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from sasflow.redact import redact_url

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@localhost:5432/sasflow"
DEFAULT_BROKER_URL = "amqp://localhost:5672/%2F"


class Settings(BaseSettings):
    """Where the state store and broker are, which namespace to use and which app to load."""

    model_config = SettingsConfigDict(env_prefix="SASFLOW_", frozen=True, extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL of the state store (postgresql+psycopg://...).",
    )
    broker_url: str = Field(
        default=DEFAULT_BROKER_URL,
        description="AMQP URL of the RabbitMQ broker (amqp://...).",
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

    def redacted(self) -> dict[str, str | None]:
        """The settings as a mapping, passwords replaced by ***."""
        return {
            "database_url": redact_url(self.database_url),
            "broker_url": redact_url(self.broker_url),
            "namespace": self.namespace,
            "app": self.app,
        }
