"""Time arithmetic done by the database clock (never a process's clock)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func, literal_column
from sqlalchemy.types import DateTime, Interval

_ONE_SECOND = literal_column("interval '1 second'", type_=Interval())


def now() -> ColumnElement[Any]:
    """The database's transaction timestamp."""
    return func.now()


def plus_seconds(ts: ColumnElement[Any], seconds: ColumnElement[Any] | float) -> ColumnElement[Any]:
    """`ts + seconds`, with `seconds` a number or a numeric SQL expression."""
    # Explicit operators: SQLAlchemy's Interval type does not declare multiplication.
    interval = _ONE_SECOND.op("*", return_type=Interval())(seconds)
    return ts.op("+", return_type=DateTime(timezone=True))(interval)
