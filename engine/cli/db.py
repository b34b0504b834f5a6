"""`sasflow db upgrade | downgrade | current | check`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click

from sasflow.cli.context import CliContext, fail
from sasflow.errors import SasflowError
from sasflow.store import migrate
from sasflow.store.db import Engine


@contextlib.contextmanager
def _engine(obj: CliContext) -> Iterator[Engine]:
    """The state store's engine for one command; a bad URL or a store error (raised while
    opening or using it) becomes a clean CLI error."""
    try:
        engine = obj.engine("db", statement_timeout_ms=None)
    except SasflowError as exc:
        raise fail(exc) from exc
    try:
        yield engine
    except SasflowError as exc:
        raise fail(exc) from exc
    finally:
        engine.dispose()


@click.group()
def db() -> None:
    """Manage the state store's schema (Alembic migrations shipped with sasflow)."""


@db.command()
@click.argument("revision", default="head")
@click.pass_obj
def upgrade(obj: CliContext, revision: str) -> None:
    """Upgrade the schema to REVISION (default: head)."""
    with _engine(obj) as engine:
        migrate.upgrade(engine, revision)
        click.echo(f"database at revision {migrate.current(engine)}")


@db.command()
@click.argument("revision")
@click.pass_obj
def downgrade(obj: CliContext, revision: str) -> None:
    """Downgrade the schema to REVISION ('base' removes every table)."""
    with _engine(obj) as engine:
        migrate.downgrade(engine, revision)
        click.echo(f"database at revision {migrate.current(engine)}")


@db.command()
@click.pass_obj
def current(obj: CliContext) -> None:
    """Print the database's revision and the head revision."""
    with _engine(obj) as engine:
        click.echo(f"current: {migrate.current(engine) or '(empty)'}")
        click.echo(f"head: {migrate.head()}")


@db.command()
@click.pass_obj
def check(obj: CliContext) -> None:
    """Exit 0 if the schema is at head and matches the models, 1 otherwise."""
    with _engine(obj) as engine:
        at, head = migrate.current(engine), migrate.head()
        if at != head:
            raise click.ClickException(
                f"database at {at or '(empty)'}, head is {head}: run `sasflow db upgrade`"
            )
        diff = migrate.differences(engine)
        if diff:
            raise click.ClickException(f"schema differs from the models: {diff}")
        click.echo(f"ok: database at head {head}, schema matches")
