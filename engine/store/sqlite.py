"""SQLite as the state store: one local file, opened so that claims stay atomic across threads
and processes and a commit survives a crash.

- Every transaction starts with `BEGIN IMMEDIATE` (SQLAlchemy's pysqlite recipe: the driver's
  own transaction handling is turned off and the `begin` event emits BEGIN): it takes the
  database's write lock up front, so transactions never deadlock upgrading a read lock, and a
  claim (select + update in one statement) is atomic without `FOR UPDATE SKIP LOCKED`.
- WAL journal, `synchronous=FULL` (durability stays on), `foreign_keys=ON` (cascades work),
  and a busy timeout: a writer waits for the lock that long, then gets "database is locked",
  which `db.translated()` turns into ConflictError (retried by `run_transaction`).
- Single machine only: SQLite's locks do not work over network file systems.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL
from sqlalchemy.pool import ConnectionPoolEntry

from sasflow.errors import ConfigurationError
from sasflow.redact import redact_url

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 10.0
"""How long a transaction waits for the write lock before failing with "database is locked"
(pysqlite's `?timeout=SECONDS` URL parameter overrides it)."""

DRIVERS = ("sqlite", "sqlite+pysqlite")

# Primary result codes (https://sqlite.org/rescode.html); extended codes keep them in the low byte.
_BUSY, _LOCKED = 5, 6
_IOERR, _FULL, _CANTOPEN = 10, 13, 14
_TOOBIG, _CONSTRAINT, _MISMATCH = 18, 19, 20


def make_sqlite_engine(url: URL, *, pool_size: int) -> Engine:
    """An engine on the SQLite file named by `url` (relative paths are from the working
    directory, as SQLAlchemy reads them)."""
    shown = redact_url(url.render_as_string(hide_password=False))
    if url.drivername not in DRIVERS:
        raise ConfigurationError(f"unsupported SQLite driver in {shown!r}: use sqlite:///PATH")
    database = url.database or ""
    if database in ("", ":memory:") or url.query.get("mode") == "memory":
        raise ConfigurationError(
            f"{shown!r} is an in-memory SQLite database, which each connection would see as a "
            "database of its own: name a file, e.g. sqlite:///sasflow.db"
        )
    folder = Path(database).parent
    if not folder.is_dir():
        raise ConfigurationError(f"{shown!r}: folder {str(folder)!r} does not exist")
    try:
        timeout = float(str(url.query.get("timeout", BUSY_TIMEOUT_S)))
    except ValueError as exc:
        raise ConfigurationError(f"{shown!r}: timeout must be a number of seconds") from exc
    engine = create_engine(
        url,
        pool_pre_ping=True,
        pool_size=pool_size,
        max_overflow=pool_size,
        connect_args={"timeout": timeout},
    )
    event.listen(engine, "connect", _configure(timeout))
    event.listen(engine, "begin", _begin_immediate)
    return engine


def _configure(busy_timeout: float) -> Callable[[Any, ConnectionPoolEntry], None]:
    def on_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:  # noqa: ARG001
        # No implicit BEGIN/COMMIT from the driver: SQLAlchemy's `begin` event emits ours.
        dbapi_connection.isolation_level = None
        _set_pragmas(dbapi_connection, busy_timeout)

    return on_connect


def _set_pragmas(dbapi_connection: Any, busy_timeout: float) -> None:
    cursor = dbapi_connection.cursor()
    try:
        (mode,) = cursor.execute("PRAGMA journal_mode=WAL").fetchone()
        if str(mode).lower() != "wal":
            log.warning("SQLite refused WAL journal mode (%s): readers will wait for writers", mode)
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        try:
            cursor.execute("SELECT power(2.0, 2.0)")
        except sqlite3.OperationalError:  # built without SQLITE_ENABLE_MATH_FUNCTIONS
            dbapi_connection.create_function("power", 2, power, deterministic=True)
    finally:
        cursor.close()


def _begin_immediate(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def power(base: float | None, exponent: float | None) -> float | None:
    """SQL `power()` where SQLite lacks it: NULL in, NULL out; an overflow is infinite, as in
    SQLite's own math functions."""
    if base is None or exponent is None:
        return None
    try:
        return math.pow(base, exponent)
    except OverflowError:
        return math.inf
    except ValueError:  # e.g. a negative base to a fractional power
        return None


def _code(exc: BaseException | None) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_conflict(exc: BaseException | None) -> bool:
    """The write lock stayed busy past the timeout: the transaction may simply be run again."""
    return _code(exc) in (_BUSY, _LOCKED)


def is_unavailable(exc: BaseException | None) -> bool:
    """The file cannot be opened, read or written (gone, unmounted, disk full)."""
    return _code(exc) in (_IOERR, _FULL, _CANTOPEN)


def is_message_fault(exc: BaseException | None) -> bool:
    """The statement was refused for the data it carries (a constraint, a value too big or of
    the wrong type): the message that brought the data may be dead-lettered."""
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.DataError):
        return True
    return _code(exc) in (_TOOBIG, _CONSTRAINT, _MISMATCH)
