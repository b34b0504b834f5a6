"""Create SQLAlchemy engines for the state store (PostgreSQL, or a SQLite file) and translate
driver failures."""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from sasflow.errors import ConfigurationError, ConflictError, StoreUnavailableError
from sasflow.redact import redact_url
from sasflow.store import sqlite

# Connection and Engine are re-exported: code outside the store names them from here, so the
# store stays the one door to SQLAlchemy.
__all__ = [
    "CONFLICTS",
    "Connection",
    "Engine",
    "is_conflict",
    "is_disconnect",
    "is_message_fault",
    "make_engine",
    "run_transaction",
    "sqlstate",
    "transaction",
    "translated",
]

T = TypeVar("T")

CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


def make_engine(
    url: str,
    *,
    application_name: str = "sasflow",
    pool_size: int = 5,
    statement_timeout_ms: int | None = 60_000,
) -> Engine:
    """An engine with the settings every sasflow process uses (pre-ping survives DB restarts).

    `sqlite:///PATH` opens a SQLite file instead (see sqlite.py; the statement timeout does not
    apply there)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigurationError(f"invalid database URL {redact_url(url)!r}: {exc}") from exc
    if parsed.get_backend_name() == "sqlite":
        return sqlite.make_sqlite_engine(parsed, pool_size=pool_size)
    if parsed.get_backend_name() != "postgresql":
        raise ConfigurationError(
            f"unsupported database {parsed.get_backend_name()!r} in {redact_url(url)!r}: "
            "sasflow's state store is PostgreSQL (postgresql+psycopg://...) or a SQLite file "
            "(sqlite:///PATH)"
        )
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return create_engine(
        parsed,
        pool_pre_ping=True,
        pool_size=pool_size,
        max_overflow=pool_size,
        connect_args=_connect_args(application_name, statement_timeout_ms),
    )


def _connect_args(application_name: str, statement_timeout_ms: int | None) -> dict[str, Any]:
    # Keepalives and a TCP user timeout notice a vanished server in about 30 s instead of
    # the kernel's ~15 minutes; the statement timeout bounds any one statement.
    args: dict[str, Any] = {
        "application_name": application_name[:63],
        "connect_timeout": 10,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 30_000,
    }
    if statement_timeout_ms is not None:
        args["options"] = f"-c statement_timeout={statement_timeout_ms}"
    return args


# What a PostgreSQL error means for the message being processed is decided by its SQLSTATE,
# not by psycopg's exception class: a read-only transaction (25006) is an InternalError, a
# statement too large for an index (54000) an OperationalError.

CONFLICT_STATES = frozenset({"40001", "40P01"})
"""Serialization failure and deadlock: run the transaction again (ConflictError)."""

UNAVAILABLE_CLASSES = frozenset({"08", "53", "57", "58", "F0"})
"""Connection exception; insufficient resources (disk full, out of memory, too many
connections); operator intervention (admin or crash shutdown, cannot connect now, statement
timeout); system error (I/O); configuration file error. The server cannot do the work now,
whatever the message."""

UNAVAILABLE_STATES = frozenset({"25006", "28000", "28P01", "40003", "55006", "55P03"})
"""Read-only transaction (a standby after failover, default_transaction_read_only, a disk-full
guard); authorization refused (credentials being rotated); statement completion unknown;
object in use and lock not available (another session holds the lock)."""

MESSAGE_FAULT_CLASSES = frozenset({"22", "23", "54"})
"""Data exception (e.g. `\\u0000` in jsonb, a number out of range), integrity constraint
violation, program limit exceeded (e.g. a value too large for an index row): the message's own
content is refused, so retrying it cannot help and it may be dead-lettered."""


def sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE of a PostgreSQL error (psycopg's, or SQLAlchemy's wrapper of one); None
    when there is none (e.g. the connection failed before the server said anything)."""
    if isinstance(exc, DBAPIError):
        exc = exc.orig
    if isinstance(exc, psycopg.Error):
        return exc.sqlstate
    return None


def is_disconnect(exc: BaseException) -> bool:
    """True when `exc` means the database cannot do the work now: it went away, refuses
    writes, or lacks resources. The operation may be retried later (StoreUnavailableError)."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    if isinstance(exc.orig, sqlite3.Error):
        # SQLite reports SQL errors ("no such table") as OperationalError too.
        return sqlite.is_unavailable(exc.orig)
    state = sqlstate(exc)
    if state is None:
        # No SQLSTATE: a client-side failure (connection lost, connect or read timeout).
        return isinstance(exc.orig, psycopg.OperationalError)
    return state in UNAVAILABLE_STATES or state[:2] in UNAVAILABLE_CLASSES


def is_message_fault(exc: BaseException) -> bool:
    """True when the database refused the statement for the data it carries, so the message
    that brought the data may be dead-lettered. Any other refusal is held and retried, or is
    a bug: never a reason to discard a message."""
    if not isinstance(exc, DBAPIError):
        return False
    if isinstance(exc.orig, sqlite3.Error):
        return sqlite.is_message_fault(exc.orig)
    state = sqlstate(exc)
    return state is not None and state[:2] in MESSAGE_FAULT_CLASSES


def is_conflict(exc: BaseException) -> bool:
    """True for a deadlock or serialization failure (SQLite: the write lock stayed busy)."""
    if not isinstance(exc, DBAPIError):
        return False
    if isinstance(exc.orig, sqlite3.Error):
        return sqlite.is_conflict(exc.orig)
    return isinstance(exc.orig, CONFLICTS) or sqlstate(exc) in CONFLICT_STATES


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Turn a database that cannot do the work now (see `is_disconnect`) into
    StoreUnavailableError, and a deadlock or serialization failure (SQLite: a write lock busy
    past its timeout) into ConflictError, at the adapter boundary. Any other driver error
    (the data, or a bug) is raised as it is."""
    try:
        yield
    except DBAPIError as exc:
        if is_conflict(exc):
            raise ConflictError(f"concurrent update, retry: {exc.orig}") from exc
        if is_disconnect(exc):
            raise StoreUnavailableError(f"state store unavailable: {exc.orig}") from exc
        raise


def run_transaction(engine: Engine, work: Callable[[Connection], T], *, attempts: int = 5) -> T:
    """`work` in one transaction, run again (after a short random pause) when a concurrent
    transaction made it fail with a deadlock or serialization failure."""
    for attempt in range(1, attempts + 1):
        try:
            with transaction(engine) as conn:
                return work(conn)
        except ConflictError:
            if attempt == attempts:
                raise
            time.sleep(random.uniform(0.01, 0.05) * attempt)  # noqa: S311 - jitter, not crypto
    raise AssertionError("unreachable")  # pragma: no cover


@contextlib.contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction; commits on success, rolls back on error, driver errors translated."""
    with translated(), engine.begin() as conn:
        yield conn
