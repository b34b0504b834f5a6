"""The test databases' pool (tests/databases.py): each clone is taken once, starts as the
template left it, and is gone from the server once given back and the pool closed."""

from __future__ import annotations

import psycopg
import pytest

from sasflow.store.listen import libpq_dsn
from tests import services
from tests.conftest import DatabaseRoles
from tests.databases import DatabasePool

pytestmark = pytest.mark.integration


def _admin(database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(libpq_dsn(services.database_url(database)), autocommit=True)


def _existing(names: list[str]) -> set[str]:
    with _admin() as admin:
        rows = admin.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", (names,)
        ).fetchall()
    return {str(name) for (name,) in rows}


def _has_probe(database: str) -> bool:
    with _admin(database) as conn:
        row = conn.execute("SELECT to_regclass('public.pool_probe') IS NOT NULL").fetchone()
    return bool(row and row[0])


def test_clones_are_distinct_fresh_and_dropped_when_the_pool_closes(
    template_database: str, database_roles: DatabaseRoles
) -> None:
    pool = DatabasePool(template_database, database_roles.owner)
    taken: list[str] = []
    try:
        taken += [pool.take(), pool.take()]
        with _admin(taken[0]) as conn:
            conn.execute("CREATE TABLE pool_probe (n int)")
        assert (_has_probe(taken[0]), _has_probe(taken[1])) == (True, False)
        for name in taken:
            pool.give_back(name)
        taken.append(pool.take())  # made while the others were used or dropped
        assert not _has_probe(taken[2])
        pool.give_back(taken[2])
    finally:
        pool.close()
    assert len(set(taken)) == 3
    assert _existing(taken) == set()
