"""A schema that is not at head, on a SQLite file: what `db check` and the roles' start say
(migrate.schema_status), and what a running role says (sasflow.schema_watch): one line while
it fails, one when it works again."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from sasflow.cli.main import cli
from sasflow.errors import SchemaOutdatedError
from sasflow.schema_watch import SchemaWatch
from sasflow.store import migrate
from sasflow.store.db import make_engine, transaction
from sasflow.store.schema import runs

HEAD = migrate.head()
PREVIOUS = "0012"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/sasflow.db"


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


def _missing(engine: Engine) -> SchemaOutdatedError:
    """What a role's statement raises while the schema lacks its table."""
    with pytest.raises(SchemaOutdatedError) as raised, transaction(engine) as conn:
        conn.execute(runs.select()).all()
    return raised.value


def _said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == "sasflow.schema_watch"
    ]


def test_the_status_names_empty_behind_at_head_and_ahead(engine: Engine) -> None:
    empty = migrate.schema_status(engine)
    assert (empty.current, empty.behind, empty.ahead) == (None, True, False)
    assert empty.sentence() == f"database at (empty), head is {HEAD}: run `sasflow db upgrade`"
    migrate.upgrade(engine, PREVIOUS)
    behind = migrate.schema_status(engine)
    assert (behind.behind, behind.ahead) == (True, False)
    assert behind.sentence() == f"database at {PREVIOUS}, head is {HEAD}: run `sasflow db upgrade`"
    with pytest.raises(SchemaOutdatedError, match=f"database at {PREVIOUS}, head is {HEAD}"):
        migrate.require_head(engine)
    migrate.upgrade(engine)
    assert migrate.require_head(engine).at_head
    with engine.begin() as conn:  # as a newer sasflow's migration would leave it
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    ahead = migrate.require_head(engine)
    assert (ahead.behind, ahead.ahead) == (False, True)
    assert "which this sasflow does not know" in ahead.sentence()


def test_a_cli_command_runs_on_a_database_ahead_of_it_and_says_so(
    engine: Engine, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Upgrades migrate before they restart the processes: the old ones keep working."""
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    done = CliRunner().invoke(
        cli, ["runs", "list", "-o", "json"], env={"SASFLOW_DATABASE_URL": sqlite_url}
    )
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == "[]"
    [warning] = [r for r in caplog.records if r.name == "sasflow.cli.context"]
    assert warning.levelname == "WARNING"
    assert warning.getMessage() == (
        f"database at 9999, which this sasflow does not know (its head is {HEAD}): a newer "
        "sasflow migrated it; carrying on"
    )


def test_a_cli_command_on_an_empty_database_says_the_sentence_with_ex_config(
    sqlite_url: str,
) -> None:
    done = CliRunner().invoke(cli, ["runs", "list"], env={"SASFLOW_DATABASE_URL": sqlite_url})
    assert done.exit_code == 78
    assert done.output == (
        f"Error: database at (empty), head is {HEAD}: run `sasflow db upgrade`\n"
    )


def test_a_role_says_it_once_while_it_fails_and_once_when_the_schema_is_back(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sasflow.schema_watch")
    watch = SchemaWatch(engine, "scheduler:x", look_every=0, quiet=3600)
    for _ in range(5):  # five passes of its loop, five failures
        watch.failed(_missing(engine))
    assert watch.waiting
    assert _said(caplog) == [
        (
            "ERROR",
            (
                f"scheduler:x: database at (empty), head is {HEAD}: run `sasflow db upgrade`; "
                "retrying quietly until then"
            ),
        )
    ]
    migrate.upgrade(engine, PREVIOUS)
    watch.ok()  # a pass that worked while still behind: not back yet
    assert watch.waiting
    migrate.upgrade(engine)
    watch.ok()
    watch.ok()
    assert not watch.waiting
    assert _said(caplog)[1:] == [("INFO", f"scheduler:x: database at {HEAD}: resumed")]


def test_a_failure_the_revision_does_not_explain_is_said_once_and_waited_out(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """At head, yet a table is gone (dropped by hand): said with the revision, and the role
    is said to resume only after `quiet` seconds without a failure."""
    caplog.set_level(logging.INFO, logger="sasflow.schema_watch")
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE runs RENAME TO runs_by_hand"))
    waits = SchemaWatch(engine, "api", look_every=0, quiet=3600)
    waits.failed(_missing(engine))
    waits.failed(_missing(engine))
    waits.ok()
    assert waits.waiting
    [(level, message)] = _said(caplog)
    assert level == "ERROR"
    assert "no such table: runs" in message
    assert f"the database is at {HEAD}, head {HEAD}: a table or column was changed by hand" in (
        message
    )
    resumes = SchemaWatch(engine, "api", look_every=0, quiet=0)
    resumes.failed(_missing(engine))
    resumes.ok()
    assert not resumes.waiting
    assert _said(caplog)[-1] == (
        "INFO",
        "api: no statement failed for want of the schema in 0s: resumed",
    )
