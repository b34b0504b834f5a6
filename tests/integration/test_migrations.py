"""Migrations: empty database -> head matches the models; downgrade and upgrade again; CLI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sasflow.cli.main import cli
from sasflow.store import migrate
from sasflow.store.db import make_engine
from tests import services

pytestmark = pytest.mark.integration


@pytest.fixture
def empty_database() -> Iterator[str]:
    name = services.unique("sasflow_mig")
    services.create_database(name)
    yield services.database_url(name)
    services.drop_database(name)


def test_upgrade_from_empty_to_head_matches_models_then_downgrade_and_upgrade(
    empty_database: str,
) -> None:
    """Autogenerate finds no difference at head; base and head are reachable both ways."""
    engine = make_engine(empty_database)
    try:
        assert migrate.current(engine) is None
        migrate.upgrade(engine)
        assert migrate.current(engine) == migrate.head()
        assert migrate.differences(engine) == []
        migrate.downgrade(engine, "base")
        assert migrate.current(engine) is None
        migrate.upgrade(engine)
        assert migrate.current(engine) == migrate.head()
        assert migrate.differences(engine) == []
    finally:
        engine.dispose()


def test_db_commands_upgrade_current_check(empty_database: str) -> None:
    """`sasflow db check` fails on an empty database and passes after `db upgrade`."""
    runner = CliRunner()
    env = {"SASFLOW_DATABASE_URL": empty_database}
    before = runner.invoke(cli, ["db", "check"], env=env)
    assert before.exit_code == 1
    assert "sasflow db upgrade" in before.output
    upgraded = runner.invoke(cli, ["db", "upgrade"], env=env)
    assert upgraded.exit_code == 0, upgraded.output
    current = runner.invoke(cli, ["db", "current"], env=env)
    assert f"current: {migrate.head()}" in current.output
    after = runner.invoke(cli, ["db", "check"], env=env)
    assert after.exit_code == 0, after.output
    assert "schema matches" in after.output


def test_db_upgrade_reports_unreachable_database_without_password() -> None:
    """An unreachable database is a clear error, and the password never reaches the output."""
    runner = CliRunner()
    url = "postgresql+psycopg://someone:s3cret@127.0.0.1:1/nowhere"
    result = runner.invoke(cli, ["db", "upgrade"], env={"SASFLOW_DATABASE_URL": url})
    assert result.exit_code == 1
    assert "unavailable" in result.output
    assert "s3cret" not in result.output


def test_db_downgrade_asks_for_dry_run_or_yes_and_previews_what_it_undoes(
    empty_database: str,
) -> None:
    """`db downgrade base` drops every table: without --yes it changes nothing."""
    runner = CliRunner()
    env = {"SASFLOW_DATABASE_URL": empty_database}
    assert runner.invoke(cli, ["db", "upgrade"], env=env).exit_code == 0
    head = migrate.head()
    for flags in ([], ["--dry-run", "--yes"]):
        refused = runner.invoke(cli, ["db", "downgrade", "base", *flags], env=env)
        assert refused.exit_code == 2, refused.output
        assert "give --dry-run to preview or --yes to downgrade" in refused.output
    preview = runner.invoke(cli, ["db", "downgrade", "base", "--dry-run"], env=env)
    assert preview.exit_code == 0, preview.output
    lines = preview.output.splitlines()
    # Newest first; numbers may skip (a migration numbered ahead for a branch merged later).
    revisions = sorted(
        (p.name[:4] for p in Path(migrate.script_location(), "versions").glob("[0-9]*.py")),
        reverse=True,
    )
    assert lines[0] == (
        f"would downgrade from {head} to base, undoing {len(revisions)} revision(s): every "
        "table and its data would go"
    )
    assert [line.split()[0] for line in lines[1:]] == revisions
    assert runner.invoke(cli, ["db", "check"], env=env).exit_code == 0  # still at head
    done = runner.invoke(cli, ["db", "downgrade", "base", "--yes"], env=env)
    assert (done.exit_code, done.output) == (0, "database at revision (empty)\n")
    nothing = runner.invoke(cli, ["db", "downgrade", "base", "--dry-run"], env=env)
    assert nothing.output == "nothing to undo: the database is at (empty)\n"


def test_db_downgrade_to_a_revision_above_the_database_is_a_clear_error(
    empty_database: str,
) -> None:
    runner = CliRunner()
    env = {"SASFLOW_DATABASE_URL": empty_database}
    assert runner.invoke(cli, ["db", "upgrade", "0005"], env=env).exit_code == 0
    done = runner.invoke(cli, ["db", "downgrade", "0009", "--yes"], env=env)
    assert done.exit_code == 1
    assert done.output == (
        "Error: cannot downgrade from 0005 to '0009': Revision 0009 is not an ancestor of "
        "revision 0005\n"
    )
    current = runner.invoke(cli, ["db", "current"], env=env)
    assert "current: 0005" in current.output
