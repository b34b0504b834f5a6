"""Column types that behave the same on PostgreSQL and SQLite."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine


class _SqliteUtcDateTime(TypeDecorator[dt.datetime]):
    """SQLite's DateTime is naive text: store UTC, and read it back timezone-aware (UTC), as
    PostgreSQL's timestamptz does, so callers never see a naive time."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(
        self,
        value: dt.datetime | None,
        dialect: Dialect,  # noqa: ARG002 - the hook's signature
    ) -> dt.datetime | None:
        if value is not None and value.tzinfo is not None:
            return value.astimezone(dt.UTC).replace(tzinfo=None)
        return value

    def process_result_value(
        self,
        value: dt.datetime | None,
        dialect: Dialect,  # noqa: ARG002 - the hook's signature
    ) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value


def Timestamp() -> TypeEngine[Any]:  # noqa: N802 - used like a type
    """A timezone-aware timestamp: timestamptz on PostgreSQL, UTC text on SQLite."""
    return DateTime(timezone=True).with_variant(_SqliteUtcDateTime(), "sqlite")
