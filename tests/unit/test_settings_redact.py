"""Settings read from SASFLOW_* variables, and password redaction of connection URLs."""

from __future__ import annotations

import os

import pydantic
import pytest

from sasflow.redact import redact_url
from sasflow.settings import Settings
from tests.unit.expected import (
    ALERT_DEFAULTS,
    API_DEFAULTS,
    CONNECTION_DEFAULTS,
    LIMIT_DEFAULTS,
    RETENTION_DEFAULTS,
    STREAM_DEFAULTS,
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No SASFLOW_* variable from the surrounding environment leaks into a test."""
    for name in list(os.environ):
        if name.upper().startswith("SASFLOW_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_defaults_without_environment(clean_env: pytest.MonkeyPatch) -> None:
    """With no SASFLOW_* variables the embedded default applies: a SQLite file in the working
    directory and the in-process bus."""
    settings = Settings()

    assert (settings.database_url, settings.broker_url, settings.namespace, settings.app) == (
        "sqlite:///sasflow.db",
        "memory://",
        "sasflow",
        None,
    )


def test_environment_variables_are_read(clean_env: pytest.MonkeyPatch) -> None:
    """Each setting is read from its SASFLOW_ variable."""
    clean_env.setenv("SASFLOW_DATABASE_URL", "postgresql+psycopg://u:p@db:5433/x")
    clean_env.setenv("SASFLOW_BROKER_URL", "amqp://u:p@mq:5673/v")
    clean_env.setenv("SASFLOW_NAMESPACE", "test-ns.1")
    clean_env.setenv("SASFLOW_APP", "myapp:registry")

    settings = Settings()

    assert (settings.database_url, settings.broker_url, settings.namespace, settings.app) == (
        "postgresql+psycopg://u:p@db:5433/x",
        "amqp://u:p@mq:5673/v",
        "test-ns.1",
        "myapp:registry",
    )


def test_explicit_arguments_override_environment(clean_env: pytest.MonkeyPatch) -> None:
    """Values passed in (e.g. CLI options) win over the environment."""
    clean_env.setenv("SASFLOW_NAMESPACE", "from-env")

    assert Settings(namespace="from-args").namespace == "from-args"


def test_unprefixed_variables_are_ignored(clean_env: pytest.MonkeyPatch) -> None:
    """Only SASFLOW_-prefixed variables are read."""
    clean_env.setenv("NAMESPACE", "nope")

    assert Settings().namespace == "sasflow"


@pytest.mark.parametrize("namespace", ["", "has space", "-dash-first", "a" * 64, "ns/evil"])
def test_invalid_namespace_is_rejected(clean_env: pytest.MonkeyPatch, namespace: str) -> None:
    """A namespace unusable as a queue-name prefix is rejected."""
    clean_env.setenv("SASFLOW_NAMESPACE", namespace)

    with pytest.raises(pydantic.ValidationError, match="namespace"):
        Settings()


def test_longest_valid_namespace_is_accepted(clean_env: pytest.MonkeyPatch) -> None:
    """63 characters is the namespace limit."""
    assert Settings(namespace="a" * 63).namespace == "a" * 63


def test_settings_are_frozen(clean_env: pytest.MonkeyPatch) -> None:
    """Settings cannot be changed once read."""
    settings = Settings()

    with pytest.raises(pydantic.ValidationError, match="frozen"):
        settings.namespace = "other"  # type: ignore[misc]


def test_redacted_hides_passwords_in_both_urls(clean_env: pytest.MonkeyPatch) -> None:
    """redacted() replaces the database and broker passwords with ***."""
    settings = Settings(
        database_url="postgresql+psycopg://app:s3cret@db.example:5432/sasflow",
        broker_url="amqps://mq:hunter2@broker.example:5671/%2F",
        namespace="prod",
        app="shop.flows",
    )

    assert settings.redacted() == {
        "database_url": "postgresql+psycopg://app:***@db.example:5432/sasflow",
        "broker_url": "amqps://mq:***@broker.example:5671/%2F",
        "namespace": "prod",
        "app": "shop.flows",
        **ALERT_DEFAULTS,
        **LIMIT_DEFAULTS,
        **RETENTION_DEFAULTS,
        **STREAM_DEFAULTS,
        **CONNECTION_DEFAULTS,
        **API_DEFAULTS,
    }


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://postgres@localhost:5432/sasflow",
        "amqp://localhost:5672/%2F",
        "sqlite:///tmp/x.db",
        "postgresql://user@[::1]:5432/db?sslmode=require",
    ],
)
def test_redact_url_keeps_urls_without_password(url: str) -> None:
    """A URL without a password is returned unchanged."""
    assert url == redact_url(url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:pw@host/db", "postgresql://u:***@host/db"),
        ("postgresql://u:pw@host:6543/db", "postgresql://u:***@host:6543/db"),
        ("postgresql://u:pw@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db"),
        ("postgresql://u:pw@[2001:db8::7]/db", "postgresql://u:***@[2001:db8::7]/db"),
        ("amqp://u:p%40ss@mq/%2F?heartbeat=30#f", "amqp://u:***@mq/%2F?heartbeat=30#f"),
        ("amqp://:pw@mq/", "amqp://:***@mq/"),
        ("amqp://u:@mq/", "amqp://u:***@mq/"),
        ("postgresql://u:p@ss@host/db", "postgresql://u:***@host/db"),
    ],
)
def test_redact_url_hides_the_password(url: str, expected: str) -> None:
    """The password is replaced, while user, host, port, IPv6 brackets, path, query stay."""
    redacted = redact_url(url)

    assert expected == redacted
    assert "pw" not in redacted


@pytest.mark.parametrize("port", ["99999", "abc"])
def test_redact_url_with_invalid_port_does_not_raise(port: str) -> None:
    """A malformed port still yields a string without the password."""
    assert "s3cret" not in redact_url(f"postgresql://u:s3cret@host:{port}/db")


@pytest.mark.parametrize("password", ["pa/ss", "pa?ss", "pa#ss"])
def test_redact_url_hides_password_with_url_delimiters(password: str) -> None:
    """A password containing '/', '?' or '#' (as SQLAlchemy accepts it) is hidden too."""
    assert password not in redact_url(f"postgresql://u:{password}@host/db")
