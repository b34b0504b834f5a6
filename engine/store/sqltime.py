"""Time arithmetic done by the database clock (never a process's clock).

PostgreSQL gets `now()` and interval arithmetic. SQLite has no timestamp type: SQLAlchemy stores
a DateTime there as text, `YYYY-MM-DD HH:MM:SS.ffffff`, so the SQLite forms produce exactly that
text (milliseconds from SQLite's clock, padded to six digits), and text comparison stays
chronological.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func, literal, literal_column
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import operators
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import DateTime, Float, Interval

from sasflow.store.types import Timestamp

_ONE_SECOND = literal_column("interval '1 second'", type_=Interval())

SQLITE_FORMAT = "%Y-%m-%d %H:%M:%f000"
"""strftime() format of SQLAlchemy's SQLite DateTime text (`%f` is `SS.SSS`)."""


class _Now(FunctionElement[Any]):
    """The database's current timestamp (PostgreSQL: the transaction's)."""

    inherit_cache = True
    type = Timestamp()


class _StatementNow(FunctionElement[Any]):
    """The database's current timestamp at the start of the statement."""

    inherit_cache = True
    type = Timestamp()


class _PlusSeconds(FunctionElement[Any]):
    """`ts + seconds`, seconds being a number or a numeric SQL expression (the two arguments)."""

    inherit_cache = True
    type = Timestamp()


class _SecondsBetween(FunctionElement[Any]):
    """`later - earlier` in seconds, a float (the two arguments)."""

    inherit_cache = True
    type = Float()


def now() -> ColumnElement[Any]:
    """The database's transaction timestamp."""
    return _Now()


def statement_now() -> ColumnElement[Any]:
    """The database's timestamp at the start of the current statement (PostgreSQL's
    `statement_timestamp()`): later than `now()` by what the transaction waited for, e.g. a
    lock. The budgeted claim reads its rate clock with it once it holds its limits' locks."""
    return _StatementNow()


def plus_seconds(ts: ColumnElement[Any], seconds: ColumnElement[Any] | float) -> ColumnElement[Any]:
    """`ts + seconds`, with `seconds` a number or a numeric SQL expression."""
    return _PlusSeconds(ts, seconds if isinstance(seconds, ColumnElement) else literal(seconds))


def seconds_between(later: ColumnElement[Any], earlier: ColumnElement[Any]) -> ColumnElement[Any]:
    """`later - earlier` in seconds (a float), both timestamps."""
    return _SecondsBetween(later, earlier)


@compiles(_Now)
def _now_default(element: _Now, compiler: SQLCompiler, **kw: Any) -> str:  # noqa: ARG001
    return compiler.process(func.now(), **kw)


@compiles(_Now, "sqlite")
def _now_sqlite(element: _Now, compiler: SQLCompiler, **kw: Any) -> str:  # noqa: ARG001
    return compiler.process(func.strftime(SQLITE_FORMAT, "now"), **kw)


@compiles(_StatementNow)
def _statement_now_default(element: _StatementNow, compiler: SQLCompiler, **kw: Any) -> str:  # noqa: ARG001
    return compiler.process(func.statement_timestamp(), **kw)


@compiles(_StatementNow, "sqlite")
def _statement_now_sqlite(element: _StatementNow, compiler: SQLCompiler, **kw: Any) -> str:  # noqa: ARG001
    return compiler.process(func.strftime(SQLITE_FORMAT, "now"), **kw)


@compiles(_PlusSeconds)
def _plus_default(element: _PlusSeconds, compiler: SQLCompiler, **kw: Any) -> str:
    # Explicit operators: SQLAlchemy's Interval type does not declare multiplication.
    ts, seconds = element.clauses
    # Grouped: `seconds` may be a sum, which must not bind to the multiplication.
    interval = _ONE_SECOND.op("*", return_type=Interval())(seconds.self_group(operators.mul))
    expr = ts.op("+", return_type=DateTime(timezone=True))(interval)
    # Parenthesised: the parent sees a function call and would not group the operator.
    return f"({compiler.process(expr, **kw)})"


@compiles(_PlusSeconds, "sqlite")
def _plus_sqlite(element: _PlusSeconds, compiler: SQLCompiler, **kw: Any) -> str:
    ts, seconds = element.clauses
    modifier = func.printf("%+.6f seconds", seconds)
    return compiler.process(func.strftime(SQLITE_FORMAT, ts, modifier), **kw)


@compiles(_SecondsBetween)
def _between_default(element: _SecondsBetween, compiler: SQLCompiler, **kw: Any) -> str:
    later, earlier = element.clauses
    diff = later.op("-", return_type=Interval())(earlier)
    return f"EXTRACT(EPOCH FROM ({compiler.process(diff, **kw)}))"


@compiles(_SecondsBetween, "sqlite")
def _between_sqlite(element: _SecondsBetween, compiler: SQLCompiler, **kw: Any) -> str:
    later, earlier = element.clauses
    days = func.julianday(later) - func.julianday(earlier)
    return f"(({compiler.process(days, **kw)}) * 86400.0)"
