"""The connection settings (SASFLOW_DB_*, SASFLOW_BROKER_*) reach SQLAlchemy's pool, psycopg's
connect arguments and pika's connection parameters (the TLS test talks to a local TLS socket,
not to a broker)."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from sasflow.cli.context import CliContext, engine_options
from sasflow.errors import BrokerUnavailableError, ConfigurationError
from sasflow.settings import Settings
from sasflow.store import db
from sasflow.store.db import EngineOptions, make_engine
from sasflow.transport.connection import BrokerOptions, connection_parameters
from sasflow.transport.factory import broker_options, make_transport
from sasflow.transport.rabbitmq import RabbitMQTransport

PG = "postgresql+psycopg://app@db.example:5432/flows"
AMQP = "amqp://mq.example:5672/%2F"
AMQPS = "amqps://mq.example:5671/%2F"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.upper().startswith("SASFLOW_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_database_variables_reach_the_engine_options(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SASFLOW_DB_POOL_SIZE", "12")
    clean_env.setenv("SASFLOW_DB_MAX_OVERFLOW", "3")
    clean_env.setenv("SASFLOW_DB_POOL_TIMEOUT", "7.5")
    clean_env.setenv("SASFLOW_DB_CONNECT_TIMEOUT", "4")
    clean_env.setenv("SASFLOW_DB_STATEMENT_TIMEOUT", "2.5")

    options = engine_options(Settings(), "scheduler")

    assert options == EngineOptions(
        application_name="sasflow-scheduler",
        pool_size=12,
        max_overflow=3,
        pool_timeout=7.5,
        connect_timeout=4,
        statement_timeout_ms=2500,
    )


def test_without_variables_a_role_keeps_five_plus_five_and_a_command_its_own_size(
    clean_env: pytest.MonkeyPatch,
) -> None:
    settings = Settings()
    role = engine_options(settings, "scheduler")
    ops = engine_options(settings, "ops", pool_size=1)
    migrations = engine_options(settings, "db", statement_timeout_ms=None)

    assert (role.pool_size, role.max_overflow, role.statement_timeout_ms) == (5, 5, 60_000)
    assert (ops.pool_size, ops.max_overflow) == (1, 1)
    assert migrations.statement_timeout_ms is None


def test_a_statement_timeout_of_zero_means_none(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SASFLOW_DB_STATEMENT_TIMEOUT", "0")
    assert engine_options(Settings(), "scheduler").statement_timeout_ms is None


def test_engine_options_reach_the_pool_and_psycopg() -> None:
    options = EngineOptions(
        application_name="sasflow-x",
        pool_size=3,
        max_overflow=2,
        pool_timeout=9.0,
        connect_timeout=4,
        statement_timeout_ms=1500,
    )
    engine = make_engine(PG, options)
    try:
        pool = engine.pool
        assert (pool.size(), pool._max_overflow, pool._timeout) == (3, 2, 9.0)  # type: ignore[attr-defined]
        args = db._connect_args(options)
        assert args["connect_timeout"] == 4
        assert args["application_name"] == "sasflow-x"
        assert args["options"] == "-c statement_timeout=1500"
    finally:
        engine.dispose()


def test_tls_parameters_in_the_database_url_reach_psycopg() -> None:
    engine = make_engine(f"{PG}?sslmode=verify-full&sslrootcert=/etc/ca.pem")
    try:
        _, params = engine.dialect.create_connect_args(engine.url)
    finally:
        engine.dispose()
    assert (params["sslmode"], params["sslrootcert"]) == ("verify-full", "/etc/ca.pem")


def test_broker_variables_reach_pika(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SASFLOW_BROKER_URL", AMQP)
    clean_env.setenv("SASFLOW_BROKER_HEARTBEAT", "7")
    clean_env.setenv("SASFLOW_BROKER_CONNECTION_ATTEMPTS", "3")
    clean_env.setenv("SASFLOW_BROKER_RETRY_DELAY", "0.5")
    clean_env.setenv("SASFLOW_BROKER_SOCKET_TIMEOUT", "4")
    clean_env.setenv("SASFLOW_BROKER_BLOCKED_CONNECTION_TIMEOUT", "0")

    transport = CliContext(Settings()).transport("scheduler")

    assert isinstance(transport, RabbitMQTransport)
    (params,) = transport._params
    shown: tuple[object, ...] = (
        params.heartbeat,
        params.connection_attempts,
        params.retry_delay,
        params.socket_timeout,
        params.blocked_connection_timeout,
        params.ssl_options,
    )
    assert shown == (7, 3, 0.5, 4, None, None)


def test_the_default_broker_options_are_those_of_before() -> None:
    params = connection_parameters(AMQP, BrokerOptions())
    assert (
        params.heartbeat,
        params.connection_attempts,
        params.socket_timeout,
        params.blocked_connection_timeout,
    ) == (30, 1, 10, 60)
    assert broker_options(Settings(broker_url=AMQP)) == BrokerOptions()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate and its key (PEM), as a private CA would issue."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def test_broker_tls_files_build_a_verifying_context(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    options = BrokerOptions(ca_file=str(cert), cert_file=str(cert), key_file=str(key))

    transport = make_transport(AMQPS, process_name="x", options=options)

    assert isinstance(transport, RabbitMQTransport)
    tls = transport._params[0].ssl_options
    assert tls is not None
    assert tls.context.verify_mode == ssl.CERT_REQUIRED
    assert tls.context.check_hostname
    assert [c["subject"] for c in tls.context.get_ca_certs()] == [((("commonName", "localhost"),),)]


def test_amqps_without_files_verifies_with_the_system_cas() -> None:
    tls = connection_parameters(AMQPS, BrokerOptions()).ssl_options
    assert tls is not None
    assert tls.context.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        (AMQP, BrokerOptions(ca_file="/etc/ca.pem"), "is not amqps://"),
        (AMQPS, BrokerOptions(ca_file="/nonexistent/ca.pem"), "TLS files cannot be used"),
        (AMQPS, BrokerOptions(key_file="/etc/key.pem"), "needs its certificate"),
    ],
)
def test_broker_tls_files_that_cannot_work_are_a_configuration_error(
    url: str, options: BrokerOptions, match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        connection_parameters(url, options)


class TlsServer:
    """A one-shot TLS endpoint on localhost: records whether the client completed the
    handshake (it then closes, so the AMQP handshake that follows fails)."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.outcome: str | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                self.outcome = f"established {tls.version()}"
        except (ssl.SSLError, OSError) as exc:
            self.outcome = f"failed: {exc}"
        finally:
            self.sock.close()


@pytest.mark.parametrize(("trust_our_ca", "outcome"), [(True, "established"), (False, "failed")])
def test_the_broker_tls_context_verifies_the_server_against_the_given_ca(
    certificate: tuple[Path, Path], trust_our_ca: bool, outcome: str
) -> None:
    """With the CA file the handshake completes; with the system's CAs the client refuses
    the self-signed certificate. Either way the AMQP handshake cannot follow: unavailable."""
    cert, key = certificate
    server = TlsServer(cert, key)
    options = BrokerOptions(ca_file=str(cert) if trust_our_ca else None, socket_timeout=5)
    transport = RabbitMQTransport(
        f"amqps://localhost:{server.port}/%2F", process_name="test-tls", options=options
    )
    with pytest.raises(BrokerUnavailableError):
        transport.connect()
    server.thread.join(10)
    assert server.outcome is not None
    assert server.outcome.startswith(outcome)
