"""The one place where PostgreSQL and SQLite differ in the SQL the engine writes.

Statements are written once; what differs is either chosen here from the engine's
`Capabilities` (the PostgreSQL fast paths, notifications, upserts), decided once per engine
from its dialect and driver, or compiled per dialect (`least`, and the time functions in
sqltime). Nothing else in the engine tests a dialect's name.
`power()` is the same function on both (sqlite.py registers it where SQLite lacks it).
`FOR UPDATE SKIP LOCKED` needs no SQLite form: SQLAlchemy leaves it out there, and every SQLite
transaction starts with `BEGIN IMMEDIATE` (see sqlite.py), which serialises writers instead.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Connection,
    Engine,
    Table,
    any_,
    bindparam,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnClause
from sqlalchemy.sql.functions import ReturnTypeFromArgs
from sqlalchemy.sql.visitors import InternalTraversal

POSTGRESQL = "postgresql"
SQLITE = "sqlite"

LISTEN_RESCAN_INTERVAL = 1.0
"""Seconds between a scheduler's claims when nothing woke it, where LISTEN/NOTIFY wakes it."""
POLL_RESCAN_INTERVAL = 0.05
"""The same on SQLite, which has no notifications: the rescan is the wake-up, so it is short
(an idle claim there is one indexed statement on a local file)."""


@dataclass(frozen=True)
class Capabilities:
    """What an engine's database lets the engine's statements do, decided once per engine from
    its dialect and driver (`capabilities`). Each fast path has a portable twin that every
    database runs and that writes the same rows (tests/integration/test_paths_agree.py)."""

    notifications: bool
    """LISTEN/NOTIFY wakes schedulers (PostgreSQL); without it they rescan often."""
    server: bool
    """A database server reached over a connection (PostgreSQL), whose refusals after a first
    connection are an outage to wait out (`db.has_connected`); SQLite is a local file."""
    one_statement_submit: bool
    """Runs recorded in one statement (store.submit_many): PostgreSQL through psycopg, whose
    parameter style the statement is written in; else a few statements per run
    (store.submit.insert_generic)."""
    merged_claim: bool
    """A claim, the runs it starts and the events of both in one statement with data-modifying
    CTEs (queries.claim_and_start); else queries.claim_ready, then queries.start_runs and
    events.record."""
    batched_complete: bool
    """A reply batch's `ok` outcomes applied in one statement over arrays
    (queries.complete_steps); else one queries.complete_step each."""
    copy_events: bool
    """Large batches of events written with COPY through psycopg; else one executemany."""
    relay_in_flight: bool
    """A relay may keep batches awaiting their confirms while it takes the next: row locks
    (SKIP LOCKED) let its transactions write side by side (SQLite has one writer)."""
    percentiles: bool
    """Percentiles computed by the database in the aggregate (`percentile_cont`, PostgreSQL);
    else the aggregate reads the values and Python interpolates them the same way
    (store.operator.charts)."""

    def portable(self) -> Capabilities:
        """The same database taken through the portable paths only (the ones SQLite takes),
        what the fast paths are compared with."""
        return replace(
            self,
            one_statement_submit=False,
            merged_claim=False,
            batched_complete=False,
            copy_events=False,
            relay_in_flight=False,
            percentiles=False,
        )


def _detect(engine: Engine) -> Capabilities:
    postgres = engine.dialect.name == POSTGRESQL
    psycopg = postgres and engine.dialect.driver == "psycopg"
    return Capabilities(
        notifications=postgres,
        server=postgres,
        one_statement_submit=psycopg,
        merged_claim=postgres,
        batched_complete=postgres,
        copy_events=psycopg,
        relay_in_flight=postgres,
        percentiles=postgres,
    )


_CAPABILITIES: weakref.WeakKeyDictionary[Engine, Capabilities] = weakref.WeakKeyDictionary()
"""Each engine's capabilities, decided at its first use (or given by `with_capabilities`)."""


def capabilities(bind: Connection | Engine) -> Capabilities:
    """The capabilities of `bind`'s engine (decided once per engine)."""
    engine = bind.engine
    try:
        return _CAPABILITIES[engine]
    except KeyError:
        decided = _CAPABILITIES[engine] = _detect(engine)
        return decided


def with_capabilities(engine: Engine, chosen: Capabilities) -> Engine:
    """An engine sharing `engine`'s pool whose statements take the paths `chosen` allows, e.g.
    `capabilities(engine).portable()` to take the portable paths on PostgreSQL."""
    derived = engine.execution_options()
    _CAPABILITIES[derived] = chosen
    return derived


def upsert_insert(conn: Connection, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT with the `on_conflict_do_nothing` / `on_conflict_do_update` API of the
    connection's database (both dialects spell them the same way)."""
    if conn.dialect.name == SQLITE:
        return sqlite.insert(table)
    return postgresql.insert(table)


def has_notifications(bind: Connection | Engine) -> bool:
    """True when the database can wake schedulers with LISTEN/NOTIFY (PostgreSQL)."""
    return capabilities(bind).notifications


def rescan_interval(bind: Connection | Engine) -> float:
    """The default seconds between a scheduler's claims on this database."""
    return LISTEN_RESCAN_INTERVAL if has_notifications(bind) else POLL_RESCAN_INTERVAL


class least(ReturnTypeFromArgs[Any]):  # noqa: N801 - SQL function names are lower case
    """The smallest argument: `least()` on PostgreSQL, multi-argument `min()` on SQLite."""

    inherit_cache = True


@compiles(least, SQLITE)
def _least_sqlite(element: least, compiler: SQLCompiler, **kw: Any) -> str:
    return f"min({compiler.process(element.clauses, **kw)})"


class joined_value(ColumnElement[Any]):  # noqa: N801 - reads as SQL
    """In an UPDATE ... FROM's RETURNING, `column` of the FROM row that `on` joins: the column
    itself on PostgreSQL; on SQLite, whose RETURNING cannot name a FROM table, a correlated
    subquery."""

    inherit_cache = True
    # The cache key: both parts (SQLAlchemy declares this as a list).
    _traverse_internals = [  # noqa: RUF012
        ("column", InternalTraversal.dp_clauseelement),
        ("on", InternalTraversal.dp_clauseelement),
    ]

    def __init__(self, column: ColumnClause[Any], on: ColumnElement[bool]) -> None:
        self.column = column
        self.on = on
        self.type = column.type


@compiles(joined_value)
def _joined_default(element: joined_value, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column, **kw)


@compiles(joined_value, SQLITE)
def _joined_sqlite(element: joined_value, compiler: SQLCompiler, **kw: Any) -> str:
    kw.pop("include_table", None)  # SQLite's RETURNING leaves tables out; the subquery needs them
    table = element.column.table
    if table is None:
        raise TypeError(f"joined_value needs a table column, got {element.column!r}")
    subquery = select(element.column).where(element.on).correlate_except(table)
    return compiler.process(subquery.scalar_subquery(), **kw)


class is_false(ColumnElement[bool]):  # noqa: N801 - reads as SQL
    """`NOT column` (a column NOT NULL: the same rows as `column IS false`), the exact form of
    the partial indexes' predicates (`WHERE NOT published`): neither SQLite's planner nor
    PostgreSQL 15's proves `NOT published` from `published IS false`, so with that form they
    walk the whole table (or a run's whole history) instead of the index."""

    inherit_cache = True
    type = Boolean()
    _is_implicitly_boolean = True  # a predicate: SQLAlchemy must not append "= 1" on SQLite
    _traverse_internals = [("column", InternalTraversal.dp_clauseelement)]  # noqa: RUF012

    def __init__(self, column: ColumnElement[bool]) -> None:
        self.column = column


@compiles(is_false)
def _is_false(element: is_false, compiler: SQLCompiler, **kw: Any) -> str:
    return f"NOT {compiler.process(element.column, **kw)}"


class one_of(ColumnElement[bool]):  # noqa: N801 - reads as SQL
    """`column` is one of the ids in the list parameter `name`.

    PostgreSQL: `column = ANY(:name)` with the list as one array parameter, so the statement's
    text is the same whatever the list's length: psycopg parses it once and prepares it, where
    an expanding `IN (:id_1, ..., :id_500)` is a new text of up to 500 placeholders each time
    (re-parsed on the client, re-planned on the server). SQLite has no arrays: an expanding IN.
    """

    inherit_cache = True
    type = Boolean()
    _is_implicitly_boolean = True
    _traverse_internals = [  # noqa: RUF012
        ("column", InternalTraversal.dp_clauseelement),
        ("name", InternalTraversal.dp_string),
    ]

    def __init__(self, column: ColumnElement[int], name: str) -> None:
        self.column = column
        self.name = name


@compiles(one_of)
def _one_of_default(element: one_of, compiler: SQLCompiler, **kw: Any) -> str:
    ids = bindparam(element.name, type_=ARRAY(BigInteger()))
    return compiler.process(element.column == any_(ids), **kw)


@compiles(one_of, SQLITE)
def _one_of_sqlite(element: one_of, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column.in_(bindparam(element.name, expanding=True)), **kw)
