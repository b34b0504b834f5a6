"""deploy/postgresql/roles.sql: the runtime role writes rows but not the schema, the read-only
role only reads, and tables a later migration creates (as the owner) get the same grants. The
test database itself was made with the script (see conftest), which may run again."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from sasflow.store.db import make_engine
from sasflow.store.schema import metadata
from tests import services
from tests.conftest import DatabaseRoles

pytestmark = pytest.mark.integration


def _run(url: str, *statements: str) -> list[object]:
    """Each statement in a transaction of its own, as the URL's role; the first column of
    the first row of each (None for statements that return no rows)."""
    engine = make_engine(url, pool_size=1)
    try:
        results: list[object] = []
        for statement in statements:
            with engine.begin() as conn:
                result = conn.execute(text(statement))
                results.append(result.scalar() if result.returns_rows else None)
        return results
    finally:
        engine.dispose()


def _denied(url: str, statement: str) -> None:
    with pytest.raises(ProgrammingError, match=r"permission denied|must be owner"):
        _run(url, statement)


def test_the_runtime_role_writes_rows_but_cannot_change_the_schema(database_url: str) -> None:
    _run(database_url, "DELETE FROM alerts", "SELECT count(*) FROM runs")
    _denied(database_url, "CREATE TABLE mine (id int)")
    _denied(database_url, "ALTER TABLE runs ADD COLUMN extra int")
    _denied(database_url, "DROP TABLE events")


def test_the_read_only_role_reads_every_table_and_writes_none(
    database_url: str, database_roles: DatabaseRoles
) -> None:
    readonly = services.with_user(database_url, database_roles.readonly)
    _run(readonly, *(f"SELECT count(*) FROM {table}" for table in metadata.tables))
    _denied(readonly, "DELETE FROM alerts")
    _denied(readonly, "UPDATE runs SET state = state")


def test_tables_a_later_migration_creates_get_the_same_grants(
    database_url: str, owner_database_url: str, database_roles: DatabaseRoles
) -> None:
    _run(owner_database_url, "CREATE TABLE later (id serial PRIMARY KEY, note text)")
    assert _run(database_url, "INSERT INTO later (note) VALUES ('x') RETURNING id") == [1]
    readonly = services.with_user(database_url, database_roles.readonly)
    assert _run(readonly, "SELECT count(*) FROM later") == [1]
    _denied(readonly, "INSERT INTO later (note) VALUES ('y')")


def test_the_roles_script_runs_again_without_error(
    admin_database_url: str, database_roles: DatabaseRoles, database_url: str
) -> None:
    database = make_url(admin_database_url).database or ""
    for _ in range(2):
        services.apply_roles_script(
            database,
            owner=database_roles.owner,
            runtime=database_roles.runtime,
            readonly=database_roles.readonly,
        )
    _run(database_url, "DELETE FROM alerts")
