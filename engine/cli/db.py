"""`sasflow db upgrade | downgrade | current | check | prune`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from sasflow.cli.context import CliContext, check_schema, default_actor, fail
from sasflow.cli.dead import parse_duration
from sasflow.cli.output import OUTPUT_OPTION, to_json
from sasflow.errors import ConflictError, SasflowError
from sasflow.ops import retention as retention_ops
from sasflow.states import TERMINAL_RUN_STATES, RunState
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
    """Manage the state store: its schema (Alembic migrations shipped with sasflow) and the
    retention of finished runs."""


MIGRATION_ATTEMPTS = 3
"""A migration's DDL may deadlock with the running roles' statements (a DROP TABLE waits for
a sweep's lock while the sweep waits for the DROP's): the one migration transaction is undone
and run again."""


def _migrate(step: Callable[[], None]) -> None:
    for attempt in range(1, MIGRATION_ATTEMPTS + 1):
        try:
            step()
        except ConflictError:
            if attempt == MIGRATION_ATTEMPTS:
                raise
            time.sleep(0.1 * attempt)
        else:
            return


@db.command()
@click.argument("revision", default="head")
@click.pass_obj
def upgrade(obj: CliContext, revision: str) -> None:
    """Upgrade the schema to REVISION (default: head)."""
    with _engine(obj) as engine:
        _migrate(lambda: migrate.upgrade(engine, revision))
        click.echo(f"database at revision {migrate.current(engine)}")


@db.command()
@click.argument("revision")
@click.option("--dry-run", is_flag=True, help="Only list the revisions that would be undone.")
@click.option(
    "--yes",
    is_flag=True,
    help="Really downgrade: what the undone revisions created goes, with its data.",
)
@click.pass_obj
def downgrade(obj: CliContext, revision: str, dry_run: bool, yes: bool) -> None:
    """Downgrade the schema to REVISION ('base' removes every table and its data): preview
    with --dry-run, act with --yes. Running roles wait for `db upgrade` (docs/operations.md)."""
    if dry_run == yes:
        raise click.UsageError(
            "give --dry-run to preview or --yes to downgrade (it drops what the undone "
            "revisions created, with its data)"
        )
    with _engine(obj) as engine:
        undone = migrate.downgrades(engine, revision)
        if dry_run:
            at = migrate.current(engine) or "(empty)"
            if not undone:
                click.echo(f"nothing to undo: the database is at {at}")
                return
            click.echo(
                f"would downgrade from {at} to {revision}, undoing {len(undone)} revision(s)"
                + (": every table and its data would go" if revision == "base" else "")
            )
            for name, doc in undone:
                click.echo(f"  {name}  {doc}")
            return
        _migrate(lambda: migrate.downgrade(engine, revision))
        click.echo(f"database at revision {migrate.current(engine) or '(empty)'}")


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
        status = migrate.schema_status(engine)
        if not status.at_head:
            raise click.ClickException(status.sentence())
        head = status.head
        diff = migrate.differences(engine)
        if diff:
            raise click.ClickException(f"schema differs from the models: {diff}")
        click.echo(f"ok: database at head {head}, schema matches")


@db.command()
@click.option(
    "--older-than",
    help="Prune runs finished more than 15m, 2h, 30d... ago [default: the retention settings, "
    "SASFLOW_RETAIN_COMPLETED_DAYS and SASFLOW_RETAIN_FAILED_DAYS].",
)
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(sorted(s.value for s in TERMINAL_RUN_STATES)),
    help="With --older-than: only runs in this finished state (repeatable) [default: all].",
)
@click.option(
    "--export",
    "export_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Append each pruned run (with its steps, events, alerts and consumed inbound events) to "
    "FILE as one JSON line, fsynced before its batch is deleted.",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 100_000),
    default=retention_ops.PruneOptions.batch,
    show_default=True,
    help="Runs deleted per transaction.",
)
@click.option("--dry-run", is_flag=True, help="Only list the runs that would be pruned.")
@click.option("--yes", is_flag=True, help="Really delete them.")
@click.option("--reason", default="retention", show_default=True, help="Why (audit trail).")
@click.option(
    "--by",
    "actor",
    default=default_actor,
    show_default="$USER@host",
    help="Who acts (recorded in the audit trail).",
)
@OUTPUT_OPTION
@click.pass_obj
def prune(
    obj: CliContext,
    older_than: str | None,
    states: tuple[str, ...],
    export_path: Path | None,
    batch: int,
    dry_run: bool,
    yes: bool,
    reason: str,
    actor: str,
    output: str,
) -> None:
    """Delete finished runs past their retention (their steps, events, alerts and the inbound
    events their waits consumed go with them), in batches that skip runs in use; a run with an
    open alert is kept. Preview with --dry-run, act with --yes."""
    if dry_run == yes:
        raise click.UsageError("give --dry-run to preview or --yes to delete")
    if states and older_than is None:
        raise click.UsageError("--state needs --older-than")
    if dry_run and export_path is not None:
        raise click.UsageError("--export writes what is deleted: not with --dry-run")
    seconds = parse_duration(older_than, "--older-than")
    try:
        policy = (
            retention_ops.RetentionPolicy.from_settings(obj.settings)
            if seconds is None
            else retention_ops.RetentionPolicy.older_than(
                seconds, tuple(RunState(s) for s in states)
            )
        )
    except SasflowError as exc:
        raise fail(exc) from exc
    with _engine(obj) as engine, contextlib.ExitStack() as files:
        check_schema(engine)
        export = (
            files.enter_context(export_path.open("a", encoding="utf-8"))
            if export_path is not None
            else None
        )
        report = retention_ops.prune(
            engine,
            policy,
            actor=actor,
            reason=reason,
            options=retention_ops.PruneOptions(batch=batch),
            dry_run=dry_run,
            export=export,
        )
    if output == "json":
        click.echo(
            to_json(
                {
                    "dry_run": dry_run,
                    "count": report.pruned,
                    "inbound_events": report.inbound_pruned,
                    "batches": report.batches,
                    "run_ids": report.run_ids,
                    "audit_id": report.audit_id,
                }
            )
        )
        return
    verb = "would prune" if dry_run else "pruned"
    click.echo(
        f"{verb} {report.pruned} finished run(s)"
        + ("" if dry_run else f" and {report.inbound_pruned} consumed inbound event(s)")
        + ("" if dry_run else f" in {report.batches} batch(es)")
        + (f"; exported to {export_path}" if export_path is not None and not dry_run else "")
    )
