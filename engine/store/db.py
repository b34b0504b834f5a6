"""Create SQLAlchemy engines for the state store (PostgreSQL, or a SQLite file) and translate
driver failures."""

from __future__ import annotations

import contextlib
import random
import re
import sqlite3
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.pool import QueuePool

from sasflow.errors import (
    ConfigurationError,
    ConflictError,
    SchemaOutdatedError,
    StoreRefusedError,
    StoreUnavailableError,
)
from sasflow.redact import redact_url
from sasflow.store import sqlite
from sasflow.store.dialect import capabilities

# Connection and Engine are re-exported: code outside the store names them from here, so the
# store stays the one door to SQLAlchemy.
__all__ = [
    "CONFLICTS",
    "Connection",
    "Engine",
    "EngineOptions",
    "has_connected",
    "is_conflict",
    "is_disconnect",
    "is_message_fault",
    "is_refused",
    "is_schema_missing",
    "libpq_conninfo",
    "make_engine",
    "run_transaction",
    "sqlstate",
    "transaction",
    "translated",
]

T = TypeVar("T")

CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


@dataclass(frozen=True)
class EngineOptions:
    """How a process connects to the state store (from Settings at the CLI; defaults here).

    TLS and any other libpq parameter (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`) go in
    the URL's query string, where the scheduler's LISTEN connection finds them too."""

    application_name: str = "sasflow"
    pool_size: int = 5
    max_overflow: int = 5
    """Connections opened beyond `pool_size` under load, closed again when returned."""
    pool_timeout: float = 30.0
    """Seconds to wait for a pooled connection when all are in use."""
    connect_timeout: int = 10
    """Seconds to establish a connection (libpq's connect_timeout, whole seconds)."""
    statement_timeout_ms: int | None = 60_000
    """Bounds any one statement; None: no bound (migrations)."""


def make_engine(
    url: str,
    options: EngineOptions | None = None,
    *,
    application_name: str | None = None,
    pool_size: int | None = None,
) -> Engine:
    """An engine with the settings every sasflow process uses (pre-ping survives DB restarts).

    `application_name` and `pool_size` override `options` (tests and short-lived tools); a
    `pool_size` given alone also sets the overflow to the same number, as before options.
    `sqlite:///PATH` opens a SQLite file instead (see sqlite.py; the timeouts do not apply)."""
    options = options or EngineOptions()
    if pool_size is not None:
        options = replace(options, pool_size=pool_size, max_overflow=pool_size)
    if application_name is not None:
        options = replace(options, application_name=application_name)
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigurationError(f"invalid database URL {redact_url(url)!r}: {exc}") from exc
    if parsed.get_backend_name() == "sqlite":
        return sqlite.make_sqlite_engine(parsed, pool_size=options.pool_size)
    parsed = _postgresql_url(parsed, url)
    try:
        # SQLAlchemy reads the hosts and ports here: a malformed multi-host URL is a
        # configuration error now, not an exception in a role's loop later.
        engine = create_engine(
            parsed,
            pool_pre_ping=True,
            pool_size=options.pool_size,
            max_overflow=options.max_overflow,
            pool_timeout=options.pool_timeout,
            connect_args=_connect_args(options),
        )
    except ArgumentError as exc:
        raise ConfigurationError(f"invalid database URL {redact_url(url)!r}: {exc}") from exc
    # A refusal before the first connection is a configuration to fix; after it, an outage
    # (credentials being rotated, a database being restored) to wait out. See `translated`.
    event.listen(engine, "connect", lambda _dbapi, _record: _CONNECTED.add(engine), once=True)
    event.listen(engine, "handle_error", _discard_read_only)
    return engine


def _postgresql_url(parsed: URL, url: str) -> URL:
    """`parsed` for the psycopg driver, with `target_session_attrs=read-write` added when it
    names several hosts and sets no `target_session_attrs` of its own (see FAILOVER_ATTRS)."""
    if parsed.get_backend_name() != "postgresql":
        raise ConfigurationError(
            f"unsupported database {parsed.get_backend_name()!r} in {redact_url(url)!r}: "
            "sasflow's state store is PostgreSQL (postgresql+psycopg://...) or a SQLite file "
            "(sqlite:///PATH)"
        )
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if host_count(parsed) > 1 and "target_session_attrs" not in parsed.query:
        parsed = parsed.update_query_dict({"target_session_attrs": FAILOVER_ATTRS})
    return parsed


FAILOVER_ATTRS = "read-write"
"""libpq's `target_session_attrs` for a URL of several hosts: connect only to the one that
accepts writes (the primary), trying them in order. Without it libpq takes the first host that
answers, a standby as readily as the primary, and every write there fails."""


def host_count(url: URL) -> int:
    """How many hosts `url` names: 1 for `host:port` in the authority or no host at all; the
    number of `host=` parameters, or of comma-separated names in one, otherwise."""
    hosts = url.query.get("host")
    if hosts is None:
        return 1
    if isinstance(hosts, str):
        hosts = (hosts,)
    return sum(len(h.split(",")) for h in hosts)


def libpq_conninfo(url: str, options: EngineOptions | None = None) -> str:
    """The libpq connection string of a PostgreSQL URL, naming the hosts, ports and query
    parameters as the pool's connections do (both multi-host forms SQLAlchemy accepts,
    FAILOVER_ATTRS included), with `options`' keepalives and timeouts when given. For
    connections opened outside the pool (the LISTEN connection). The password is kept: not
    for logging."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigurationError(f"invalid database URL {redact_url(url)!r}: {exc}") from exc
    parsed = _postgresql_url(parsed, url)
    try:
        _args, params = parsed.get_dialect()().create_connect_args(parsed)
    except ArgumentError as exc:
        raise ConfigurationError(f"invalid database URL {redact_url(url)!r}: {exc}") from exc
    params.pop("context", None)  # the dialect's psycopg adapters, not a libpq parameter
    if options is not None:
        params.update(_connect_args(options))
    return make_conninfo("", **params)


def pool_capacity(engine: Engine) -> int:
    """How many connections `engine` may hold at once: pool size plus overflow (an unbounded
    overflow counts as 100; SQLite's pools as 1)."""
    pool = engine.pool
    if not isinstance(pool, QueuePool):
        return 1
    overflow: int = getattr(pool, "_max_overflow", 0)
    return 100 if overflow < 0 else pool.size() + overflow


def spare_connections(engine: Engine) -> int:
    """How many more connections `engine`'s pool would hand out now without waiting (0 for
    SQLite's pools): several roles of one process (`sasflow run`) share one pool."""
    pool = engine.pool
    if not isinstance(pool, QueuePool):
        return 0
    return pool_capacity(engine) - pool.checkedout()


_CONNECTED: weakref.WeakSet[Engine] = weakref.WeakSet()
"""Engines that have opened at least one connection."""


def has_connected(engine: Engine) -> bool:
    """True once `engine` has opened a connection (SQLite engines: always)."""
    return engine in _CONNECTED or not capabilities(engine).server


def _connect_args(options: EngineOptions) -> dict[str, Any]:
    # Keepalives and a TCP user timeout notice a vanished server in about 30 s instead of
    # the kernel's ~15 minutes; the statement timeout bounds any one statement.
    args: dict[str, Any] = {
        "application_name": options.application_name[:63],
        "connect_timeout": options.connect_timeout,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 30_000,
    }
    if options.statement_timeout_ms is not None:
        args["options"] = f"-c statement_timeout={options.statement_timeout_ms}"
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

READ_ONLY_STATES = frozenset({"25006"})
"""This session refuses writes: the server is a standby (after a failover, or a demoted
primary), or the session started read-only (`default_transaction_read_only`). It stays so: the
connection is discarded (see `_discard_read_only`) for the next one to find a writable server."""

REFUSED_STATES = frozenset({"28000", "28P01", "3D000"})
"""Invalid authorization (no such role, no pg_hba.conf entry, a role not permitted to log in),
password authentication failed, no such database: this process's configuration is refused.
Also unavailable (see `is_disconnect`): after a first connection it is waited out."""

REFUSED_MESSAGES = re.compile(
    r"FATAL:\s+(?:"
    r"password authentication failed"
    r"|role \".*\" does not exist"
    r"|database \".*\" does not exist"
    r"|role \".*\" is not permitted to log in"
    r"|no pg_hba\.conf entry"
    r"|permission denied for database"
    r"|\w+ authentication failed"
    r")"
    r"|fe_sendauth: no password supplied"
)
"""libpq reports a failed connection start-up as text only (psycopg's `sqlstate` is None): the
server's messages for REFUSED_STATES and for a missing CONNECT privilege (42501). English
messages only: a server with another `lc_messages` has its refusals retried as outages."""

MESSAGE_FAULT_CLASSES = frozenset({"22", "23", "54"})
"""Data exception (e.g. `\\u0000` in jsonb, a number out of range), integrity constraint
violation, program limit exceeded (e.g. a value too large for an index row): the message's own
content is refused, so retrying it cannot help and it may be dead-lettered."""


SCHEMA_STATES = frozenset({"42P01", "42703", "42883", "42704"})
"""Undefined table, column, function or object (a type, say): sasflow's statements name only
what its migrations create, so the schema is not at their head (never migrated, or an
operator's downgrade). The store cannot do the work until it is upgraded (SchemaOutdatedError,
waited for like an outage); that it is, and not a bug or a hand-made change, is checked by who
reports it (sasflow.schema_watch reads the database's revision)."""

SQLITE_SCHEMA_MESSAGES = re.compile(r"^no such (?:table|column|function):")
"""SQLite's words for the same: it reports every SQL error as SQLITE_ERROR."""


def _discard_read_only(context: ExceptionContext) -> None:
    # A session on a standby keeps refusing writes, and pool_pre_ping does not notice: a
    # standby answers it. Counted as a disconnect, the connection is closed (and every other
    # one the pool held before it, on the same old server) and the error raised with
    # `connection_invalidated`, which `translated` turns into StoreUnavailableError.
    if sqlstate(context.original_exception) in READ_ONLY_STATES:
        context.is_disconnect = True


def sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE of a PostgreSQL error (psycopg's, or SQLAlchemy's wrapper of one); None
    when there is none (e.g. the connection failed before the server said anything)."""
    if isinstance(exc, DBAPIError):
        exc = exc.orig
    if isinstance(exc, psycopg.Error):
        return exc.sqlstate
    return None


def is_refused(exc: BaseException) -> bool:
    """True when the database refused this process's credentials or database name (see
    REFUSED_STATES): a configuration error at start-up, an outage afterwards."""
    if not isinstance(exc, DBAPIError) or not isinstance(exc.orig, psycopg.Error):
        return False
    state = sqlstate(exc)
    if state is not None:
        return state in REFUSED_STATES
    return REFUSED_MESSAGES.search(str(exc.orig)) is not None


def is_schema_missing(exc: BaseException) -> bool:
    """True when a statement failed because the schema lacks a table, column, function or
    type it names (see SCHEMA_STATES)."""
    if not isinstance(exc, DBAPIError):
        return False
    if isinstance(exc.orig, sqlite3.Error):
        return SQLITE_SCHEMA_MESSAGES.search(str(exc.orig)) is not None
    return sqlstate(exc) in SCHEMA_STATES


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
    if is_refused(exc):
        return True
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
def translated(engine: Engine | None = None) -> Iterator[None]:
    """Turn a database that cannot do the work now (see `is_disconnect`, and a pool with no
    connection free within its timeout) into
    StoreUnavailableError, a deadlock or serialization failure (SQLite: a write lock busy
    past its timeout) into ConflictError, and a statement naming what the schema lacks
    (`is_schema_missing`) into SchemaOutdatedError, at the adapter boundary. A refusal of the
    credentials or database (`is_refused`) is StoreRefusedError, marked `never_connected` when
    `engine` has never connected. Any other driver error (the data, or a bug) is raised as it
    is."""
    try:
        yield
    except PoolTimeoutError as exc:
        # Every pooled connection is in use past the pool's timeout: the store cannot take the
        # work now; the role retries as after a lost connection instead of crashing.
        raise StoreUnavailableError(f"no database connection free in the pool: {exc}") from exc
    except DBAPIError as exc:
        if is_conflict(exc):
            raise ConflictError(f"concurrent update, retry: {exc.orig}") from exc
        if is_refused(exc):
            raise StoreRefusedError(
                f"state store refused the connection: {_one_line(exc.orig)}",
                never_connected=engine is not None and not has_connected(engine),
            ) from exc
        if is_disconnect(exc):
            raise StoreUnavailableError(f"state store unavailable: {exc.orig}") from exc
        if is_schema_missing(exc):
            raise SchemaOutdatedError(
                f"the database lacks what sasflow needs ({_first_line(exc.orig)})"
                ": is its schema at head? `sasflow db check` tells, `sasflow db upgrade` "
                "migrates it"
            ) from exc
        raise


def _one_line(error: BaseException | None) -> str:
    return " ".join(str(error).split())


def _first_line(error: BaseException | None) -> str:
    """The server's message without the statement it quotes (`LINE 2: FROM ...`)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


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


def rehearse(conn: Connection, work: Callable[[Connection], T]) -> T:
    """`work`'s answer with everything it wrote undone (a savepoint rolled back): a dry run
    of the very code the real action runs."""
    savepoint = conn.begin_nested()
    try:
        return work(conn)
    finally:
        savepoint.rollback()


@contextlib.contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction; commits on success, rolls back on error, driver errors translated."""
    with translated(engine), engine.begin() as conn:
        yield conn
