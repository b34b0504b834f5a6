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
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from sasflow.errors import ConfigurationError, ConflictError, StoreUnavailableError
from sasflow.redact import redact_url
from sasflow.store import sqlite

# Connection and Engine are re-exported: code outside the store names them from here, so the
# store stays the one door to SQLAlchemy.
__all__ = [
    "CONFLICTS",
    "Connection",
    "Engine",
    "is_disconnect",
    "make_engine",
    "run_transaction",
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


def is_disconnect(exc: BaseException) -> bool:
    """True when `exc` means the database went away (the operation may be retried later)."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, DBAPIError) and isinstance(exc.orig, sqlite3.Error):
        # SQLite reports SQL errors ("no such table") as OperationalError too.
        return sqlite.is_unavailable(exc.orig)
    return isinstance(exc, OperationalError)


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Turn a lost database connection into StoreUnavailableError, and a deadlock or
    serialization failure (SQLite: a write lock busy past its timeout) into ConflictError, at
    the adapter boundary."""
    try:
        yield
    except DBAPIError as exc:
        if isinstance(exc.orig, CONFLICTS) or sqlite.is_conflict(exc.orig):
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
