"""Database errors are classified by SQLSTATE, not by the driver's exception class: a database
that cannot do the work now (gone, read-only, out of resources, or a schema that lacks what a
statement names) is held and retried; a conflict is retried; only a refusal of the message's own
data may dead-letter the message."""

from __future__ import annotations

import sqlite3

import psycopg
import psycopg.errors
import pytest
from sqlalchemy.exc import DBAPIError

from sasflow.errors import ConflictError, SchemaOutdatedError, StoreUnavailableError
from sasflow.store.db import is_disconnect, is_message_fault, sqlstate, translated

HELD = [
    "08000",  # connection exception
    "08001",  # client unable to establish connection
    "08006",  # connection failure
    "25006",  # read-only transaction: standby after failover, default_transaction_read_only
    "53000",  # insufficient resources
    "53100",  # disk full
    "53200",  # out of memory
    "53300",  # too many connections
    "53400",  # configuration limit exceeded
    "57P01",  # admin shutdown
    "57P02",  # crash shutdown
    "57P03",  # cannot connect now (starting up, shutting down)
    "57014",  # query canceled (statement timeout)
    "58030",  # I/O error
    "55P03",  # lock not available
    "28P01",  # password authentication failed (credentials being rotated)
    "F0000",  # configuration file error
]
CONFLICTS = ["40001", "40P01"]  # serialization failure, deadlock
MESSAGE_FAULTS = [
    "22P05",  # untranslatable character (\u0000 in jsonb)
    "22003",  # numeric value out of range
    "22001",  # string data right truncation
    "23505",  # unique violation
    "23502",  # not null violation
    "23503",  # foreign key violation
    "23514",  # check violation
    "54000",  # program limit exceeded (e.g. index row too large)
]
SCHEMA = [
    "42P01",  # undefined table: never migrated, or downgraded under the running roles
    "42703",  # undefined column: migrated behind the head
    "42883",  # undefined function
    "42704",  # undefined object (a type)
]
NEITHER = [
    "42501",  # insufficient privilege
    "42601",  # syntax error: a bug, not the schema's
    "XX000",  # internal error
    "0A000",  # feature not supported
]


def _wrapped(orig: Exception) -> DBAPIError:
    """What SQLAlchemy raises for a driver error: the DBAPIError subclass named like it."""
    error = DBAPIError.instance("INSERT INTO runs ...", {}, orig, psycopg.Error)
    assert isinstance(error, DBAPIError)
    return error


def _postgres(state: str) -> DBAPIError:
    return _wrapped(psycopg.errors.lookup(state)(f"SQLSTATE {state}"))


def _outcome(error: DBAPIError) -> str:
    try:
        with translated():
            raise error
    except ConflictError:
        return "conflict"
    except SchemaOutdatedError:
        return "schema"
    except StoreUnavailableError:
        return "held"
    except DBAPIError as exc:
        same = exc is error
        return ("message fault" if is_message_fault(exc) else "neither") if same else "changed"
    raise AssertionError("unreachable")  # pragma: no cover


@pytest.mark.parametrize(
    ("state", "expected"),
    [(s, "held") for s in HELD]
    + [(s, "conflict") for s in CONFLICTS]
    + [(s, "message fault") for s in MESSAGE_FAULTS]
    + [(s, "schema") for s in SCHEMA]
    + [(s, "neither") for s in NEITHER],
)
def test_a_postgresql_error_is_classified_by_its_sqlstate(state: str, expected: str) -> None:
    error = _postgres(state)
    assert sqlstate(error) == state
    assert (state, _outcome(error)) == (state, expected)


def test_a_read_only_transaction_is_held_although_psycopg_calls_it_an_internal_error() -> None:
    error = _postgres("25006")
    assert isinstance(error.orig, psycopg.InternalError)
    assert (is_disconnect(error), is_message_fault(error)) == (True, False)


@pytest.mark.parametrize(
    ("orig", "expected"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), "held"),
        (psycopg.errors.ConnectionTimeout("connection timeout expired"), "held"),
        (psycopg.InterfaceError("the cursor is closed"), "neither"),
    ],
    ids=["lost", "connect-timeout", "interface"],
)
def test_an_error_without_sqlstate_is_held_only_when_the_connection_failed(
    orig: psycopg.Error, expected: str
) -> None:
    error = _wrapped(orig)
    assert sqlstate(error) is None
    assert _outcome(error) == expected


def test_an_invalidated_connection_is_held_whatever_the_error() -> None:
    error = _postgres("42P01")
    error.connection_invalidated = True
    assert _outcome(error) == "held"


def test_a_missing_table_says_which_without_the_statement() -> None:
    error = _wrapped(
        psycopg.errors.UndefinedTable(
            'relation "schedulers" does not exist\nLINE 2: FROM schedulers\n             ^'
        )
    )
    with pytest.raises(SchemaOutdatedError) as raised, translated():
        raise error
    assert str(raised.value).startswith(
        'the database lacks what sasflow needs (relation "schedulers" does not exist): '
    )
    assert "LINE" not in str(raised.value)
    assert "sasflow db upgrade" in str(raised.value)


def _sqlite(cls: type[sqlite3.Error], code: int, message: str | None = None) -> DBAPIError:
    orig = cls(message or f"sqlite error code {code}")
    orig.sqlite_errorcode = code
    return DBAPIError.instance("INSERT INTO runs ...", {}, orig, sqlite3.Error)  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("cls", "code", "expected"),
    [
        (sqlite3.OperationalError, 5, "conflict"),  # SQLITE_BUSY past the busy timeout
        (sqlite3.OperationalError, 6, "conflict"),  # SQLITE_LOCKED
        (sqlite3.OperationalError, 10 | (3 << 8), "held"),  # SQLITE_IOERR_WRITE
        (sqlite3.OperationalError, 13, "held"),  # SQLITE_FULL
        (sqlite3.OperationalError, 14, "held"),  # SQLITE_CANTOPEN
        (sqlite3.IntegrityError, 19 | (5 << 8), "message fault"),  # SQLITE_CONSTRAINT_NOTNULL
        (sqlite3.DataError, 18, "message fault"),  # SQLITE_TOOBIG
        (sqlite3.OperationalError, 1, "neither"),  # SQLITE_ERROR: a syntax error, say
    ],
)
def test_sqlite_errors_keep_their_result_code_classification(
    cls: type[sqlite3.Error], code: int, expected: str
) -> None:
    assert _outcome(_sqlite(cls, code)) == expected


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("no such table: runs", "schema"),
        ("no such column: runs.pool", "schema"),
        ('near "SELEC": syntax error', "neither"),
    ],
)
def test_sqlite_says_what_the_schema_lacks_in_words(message: str, expected: str) -> None:
    """SQLite reports every SQL error as SQLITE_ERROR: its message tells them apart."""
    assert _outcome(_sqlite(sqlite3.OperationalError, 1, message)) == expected
