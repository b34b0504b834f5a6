"""The one place where PostgreSQL and SQLite differ in the SQL the engine writes.

Statements are written once; what differs is either chosen from the connection's dialect here
(upserts, notifications) or compiled per dialect (`least`, and the time functions in sqltime).
`power()` is the same function on both (sqlite.py registers it where SQLite lacks it).
`FOR UPDATE SKIP LOCKED` needs no SQLite form: SQLAlchemy leaves it out there, and every SQLite
transaction starts with `BEGIN IMMEDIATE` (see sqlite.py), which serialises writers instead.
"""

from __future__ import annotations

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


def upsert_insert(conn: Connection, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT with the `on_conflict_do_nothing` / `on_conflict_do_update` API of the
    connection's database (both dialects spell them the same way)."""
    if conn.dialect.name == SQLITE:
        return sqlite.insert(table)
    return postgresql.insert(table)


def has_notifications(bind: Connection | Engine) -> bool:
    """True when the database can wake schedulers with LISTEN/NOTIFY (PostgreSQL)."""
    return bind.dialect.name == POSTGRESQL


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
    """`column IS false`; on SQLite `NOT column`, the exact form of the partial indexes'
    predicates (`WHERE NOT published`), which SQLite's planner needs to use them."""

    inherit_cache = True
    type = Boolean()
    _is_implicitly_boolean = True  # a predicate: SQLAlchemy must not append "= 1" on SQLite
    _traverse_internals = [("column", InternalTraversal.dp_clauseelement)]  # noqa: RUF012

    def __init__(self, column: ColumnElement[bool]) -> None:
        self.column = column


@compiles(is_false)
def _is_false_default(element: is_false, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column.is_(False), **kw)


@compiles(is_false, SQLITE)
def _is_false_sqlite(element: is_false, compiler: SQLCompiler, **kw: Any) -> str:
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
