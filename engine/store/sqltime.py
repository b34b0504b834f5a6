"""Time arithmetic done by the database clock (never a process's clock)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func, literal_column
from sqlalchemy.types import Interval

_ONE_SECOND = literal_column("interval '1 second'", type_=Interval())


def now() -> ColumnElement[Any]:
    """The database's transaction timestamp."""
    return func.now()


def plus_seconds(ts: ColumnElement[Any], seconds: ColumnElement[Any] | float) -> ColumnElement[Any]:
    """`ts + seconds`, with `seconds` a number or a numeric SQL expression."""
    return ts + _ONE_SECOND * seconds

