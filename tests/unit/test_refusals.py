"""A refusal of this process's configuration (credentials, database, virtual host) is told apart
from an outage: before a first connection the role gives up with exit status 78, afterwards it
retries like for an outage but logs an error."""

from __future__ import annotations

import logging
import threading

import pika.exceptions
import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from sasflow.cli.context import EX_CONFIG, fail, role_failed
from sasflow.errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    StoreRefusedError,
    StoreUnavailableError,
)
from sasflow.runtime import Reconnect, serve_forever
from sasflow.store import db
from sasflow.transport import rabbitmq

SERVER = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: '


def _connect_error(message: str) -> OperationalError:
    """What SQLAlchemy raises when psycopg cannot connect (libpq gives text, no SQLSTATE)."""
    return OperationalError("connect", {}, psycopg.OperationalError(SERVER + message))


@pytest.mark.parametrize(
    "message",
    [
        'FATAL:  database "nowhere" does not exist',
        'FATAL:  role "nobody" does not exist',
        'FATAL:  password authentication failed for user "app"',
        'FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "app", database "flows"',
        'FATAL:  role "app" is not permitted to log in',
        'FATAL:  permission denied for database "flows"',
        'FATAL:  Peer authentication failed for user "app"',
        "fe_sendauth: no password supplied",
    ],
)
def test_a_refused_connection_is_refused_and_unavailable(message: str) -> None:
    error = _connect_error(message)
    assert db.is_refused(error)
    assert db.is_disconnect(error)  # during operation it is waited out like an outage


@pytest.mark.parametrize(
    "message",
    [
        "FATAL:  sorry, too many clients already",
        'FATAL:  too many connections for role "app"',
        "FATAL:  the database system is starting up",
        "Connection refused\n\tIs the server running on that host and accepting TCP/IP?",
        "timeout expired",
    ],
)
def test_a_server_not_ready_is_unavailable_not_refused(message: str) -> None:
    error = _connect_error(message)
    assert not db.is_refused(error)
    assert db.is_disconnect(error)


def _translate(engine: db.Engine | None, error: Exception) -> BaseException:
    def fail_with_it() -> None:
        raise error

    try:
        with db.translated(engine):
            fail_with_it()
    except Exception as exc:  # noqa: BLE001 - which one comes out is the point
        return exc
    raise AssertionError("nothing raised")  # pragma: no cover


def test_a_refusal_is_never_connected_until_the_engine_first_connects() -> None:
    engine = db.make_engine("postgresql+psycopg://app@127.0.0.1:1/flows")
    error = _connect_error('FATAL:  database "flows" does not exist')
    try:
        before = _translate(engine, error)
        db._CONNECTED.add(engine)  # what the engine's first connection does
        after = _translate(engine, error)
    finally:
        engine.dispose()
    assert isinstance(before, StoreRefusedError)
    assert before.never_connected
    assert isinstance(after, StoreRefusedError)
    assert not after.never_connected
    assert "\n" not in str(before)


def test_an_outage_is_still_unavailable_not_refused() -> None:
    translated = _translate(None, _connect_error("FATAL:  sorry, too many clients already"))
    assert type(translated) is StoreUnavailableError


def test_a_403_on_a_declare_is_a_refusal_of_the_user() -> None:
    closed = pika.exceptions.ChannelClosedByBroker(403, "ACCESS_REFUSED - access to exchange")

    def declare() -> None:
        raise closed

    with pytest.raises(BrokerRefusedError) as raised, rabbitmq._translated(never_connected=True):
        declare()
    assert raised.value.never_connected


class Script:
    """A role's `serve` that raises the given errors one call after the other, then stops."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.stop = threading.Event()

    def serve(self) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        self.stop.set()


@pytest.mark.parametrize(
    "refusal",
    [
        StoreRefusedError("no such database", never_connected=True),
        BrokerRefusedError("login refused", never_connected=True),
    ],
)
def test_serve_forever_gives_up_on_a_refusal_before_any_connection(refusal: Exception) -> None:
    script = Script(refusal)
    with pytest.raises(type(refusal)):
        serve_forever("role", script.serve, script.stop, Reconnect(0.001, 0.001))
    assert script.calls == 1


def test_serve_forever_retries_a_refusal_after_a_connection_and_logs_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sasflow.runtime")
    script = Script(
        StoreRefusedError("password rotated", never_connected=False),
        BrokerUnavailableError("broker restarting"),
    )
    serve_forever("role", script.serve, script.stop, Reconnect(0.001, 0.001))
    logged = [(r.levelname, "password rotated" in r.getMessage()) for r in caplog.records]
    assert logged == [("ERROR", True), ("WARNING", False)]
    assert script.calls == 3


def test_a_role_exits_78_on_a_refusal_at_start_and_1_afterwards() -> None:
    at_start = role_failed(StoreRefusedError("no such database", never_connected=True))
    later = role_failed(StoreRefusedError("password rotated", never_connected=False))
    broker = role_failed(BrokerRefusedError("vhost not found", never_connected=True))
    assert (at_start.exit_code, later.exit_code, broker.exit_code) == (EX_CONFIG, 1, EX_CONFIG)
    assert EX_CONFIG == 78


def test_an_operator_command_keeps_exit_status_1_for_a_refusal() -> None:
    assert fail(StoreRefusedError("no such database", never_connected=True)).exit_code == 1
