"""The schema check of the commands and roles with grants narrower than deploy's roles.sql: a
role that may not read `alembic_version` is not refused for it, it is told."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from sasflow.cli.main import cli
from sasflow.store.db import make_engine
from tests.conftest import DatabaseRoles

pytestmark = pytest.mark.integration


def test_a_revision_the_role_may_not_read_is_not_checked_and_said(
    admin_database_url: str,
    database_url: str,
    database_roles: DatabaseRoles,
    caplog: pytest.LogCaptureFixture,
) -> None:
    admin = make_engine(admin_database_url, pool_size=1)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'REVOKE SELECT ON alembic_version FROM "{database_roles.runtime}"'))
    finally:
        admin.dispose()
    caplog.set_level(logging.WARNING, logger="sasflow.cli.context")
    done = CliRunner().invoke(
        cli, ["runs", "list", "-o", "json"], env={"SASFLOW_DATABASE_URL": database_url}
    )
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == "[]"
    [warning] = [r.getMessage() for r in caplog.records if r.name == "sasflow.cli.context"]
    assert warning == (
        "the database's revision cannot be read (permission denied for table alembic_version): "
        "not checked; carrying on"
    )
