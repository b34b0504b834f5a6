"""`sasflow runs migrate`: move the runs in flight of a workflow version to another version
(sasflow.ops.migrate; docs/operations.md "Migrating runs in flight")."""

from __future__ import annotations

from typing import Any

import click

from sasflow.cli.context import CliContext, check_schema, fail
from sasflow.cli.output import OUTPUT_OPTION, to_json
from sasflow.cli.runs import BY_OPTION, REASON_OPTION
from sasflow.errors import SasflowError
from sasflow.ops import migrate as migrate_ops


def _renames(values: tuple[str, ...]) -> dict[str, str]:
    renames: dict[str, str] = {}
    for value in values:
        before, sep, after = value.partition("=")
        if not sep or not before or not after:
            raise click.BadParameter(f"{value!r} is not OLD=NEW", param_hint="--map")
        if before in renames:
            raise click.BadParameter(f"step {before!r} is mapped twice", param_hint="--map")
        renames[before] = after
    return renames


@click.command("migrate")
@click.option("--workflow", required=True, help="Workflow name.")
@click.option("--from-version", type=click.IntRange(min=1), required=True, help="Runs of it.")
@click.option("--to-version", type=click.IntRange(min=1), required=True, help="Move them to it.")
@click.option(
    "--map",
    "renames",
    multiple=True,
    metavar="OLD=NEW",
    help="An old step renamed in the new version (repeatable); other steps match by name.",
)
@REASON_OPTION
@click.option("--dry-run", is_flag=True, help="Only show each run's diff; change nothing.")
@click.option("--yes", is_flag=True, help="Really migrate them.")
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def migrate_command(
    obj: CliContext,
    workflow: str,
    from_version: int,
    to_version: int,
    renames: tuple[str, ...],
    reason: str,
    dry_run: bool,
    yes: bool,
    actor: str,
    output: str,
) -> None:
    """Migrate the pending and running runs of WORKFLOW from one version to another, one
    transaction per run: steps matched by name (or --map) keep their state and idempotency
    key, new steps are added, a step in flight is never dropped (its run is refused). Preview
    with --dry-run, act with --yes; exits 1 when a run is refused."""
    if dry_run == yes:
        raise click.UsageError("give --dry-run to preview or --yes to migrate (one of them)")
    spec = migrate_ops.Migration(workflow, from_version, to_version, _renames(renames))
    try:
        registry = obj.registry()
        engine = obj.engine("ops", pool_size=1)
        try:
            check_schema(engine)
            done = migrate_ops.migrate_runs(
                engine,
                registry,
                spec,
                actor=actor,
                reason=reason,
                namespace=obj.settings.namespace,
                dry_run=dry_run,
            )
        finally:
            engine.dispose()
    except SasflowError as exc:
        raise fail(exc) from exc
    summaries = [d.summary() for d in done]
    if output == "json":
        click.echo(to_json({"dry_run": dry_run, "runs": summaries}))
    else:
        for summary in summaries:
            click.echo(_line(summary, dry_run=dry_run))
        verb = "would migrate" if dry_run else "migrated"
        moved = sum(1 for s in summaries if s["refused"] is None)
        click.echo(f"{verb} {moved} of {len(summaries)} run(s) to version {to_version}")
    refused = [s["run_id"] for s in summaries if s["refused"] is not None]
    if refused:
        raise click.ClickException(f"refused run(s): {' '.join(str(i) for i in refused)}")


def _line(summary: dict[str, Any], *, dry_run: bool) -> str:
    """One run's diff: `run 7: + ship; pay <- charge; - email; history: audit`."""
    run = f"run {summary['run_id']}"
    if summary["refused"] is not None:
        return f"{run}: refused: {summary['refused']}"
    parts = [f"+ {name}" for name in summary["added"]]
    parts += [f"{new} <- {old}" for old, new in summary["renamed"].items()]
    parts += [f"- {name}" for name in summary["removed"]]
    if summary["history"]:
        parts.append(f"history: {', '.join(summary['history'])}")
    diff = "; ".join(parts) or "same steps"
    return f"{run} ({summary['state']}){' would be' if dry_run else ''}: {diff}"
