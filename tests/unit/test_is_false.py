"""`is_false` is written `NOT column` on every database: the predicate of the partial indexes on
`events.published` (ix_events_unpublished, ix_events_run_unpublished), which PostgreSQL 15 and
SQLite use only for that exact form (with `published IS false` the relay walked a run's whole
history for each event it published: docs/performance.md, "Map steps at scale")."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from sasflow.store.dialect import is_false
from sasflow.store.runs import queries
from sasflow.store.schema import events

DIALECTS: list[Dialect] = [
    postgresql.psycopg.dialect(),  # type: ignore[no-untyped-call]
    sqlite.pysqlite.dialect(),
]


@pytest.mark.parametrize("dialect", DIALECTS, ids=["pg", "sqlite"])
def test_is_false_is_the_partial_indexes_predicate(dialect: Dialect) -> None:
    assert str(is_false(events.c.published).compile(dialect=dialect)) == "NOT events.published"
    relay = str(queries.unpublished_events().compile(dialect=dialect))
    assert "NOT earlier.published" in relay
    assert "IS false" not in relay
