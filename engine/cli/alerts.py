"""`sasflow alerts list | show | ack | incidents | incident`: what the supervisor raised,
grouped by cause into incidents, and the operator's answer."""

from __future__ import annotations

from functools import partial
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from sasflow.cli import incidents as incident_cli
from sasflow.cli.context import CliContext, check_schema, default_actor, fail
from sasflow.cli.output import OUTPUT_OPTION, Column, cell, print_table, to_json
from sasflow.errors import (
    AlertAlreadyAcknowledgedError,
    AlertNotFoundError,
    IncidentAlreadyAcknowledgedError,
    IncidentNotFoundError,
    SasflowError,
)
from sasflow.ops import alerts as alert_ops
from sasflow.store.db import Connection, run_transaction


@click.group()
def alerts() -> None:
    """List, inspect and acknowledge the alerts the supervisor raised."""


@alerts.command("list")
@click.option("--all", "include_all", is_flag=True, help="Include acknowledged alerts.")
@click.option("--kind", help="Only this kind (step_failed, compensation_failed, stalled...).")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option(
    "--undelivered",
    is_flag=True,
    help="Only alerts a sink failed to take (being retried, or given up a day after they "
    "were raised), acknowledged or not.",
)
@OUTPUT_OPTION
@click.pass_obj
def list_command(
    obj: CliContext,
    include_all: bool,
    kind: str | None,
    limit: int,
    undelivered: bool,
    output: str,
) -> None:
    """List open alerts, newest first."""
    found, now = obj.read(
        lambda conn: alert_ops.list_alerts(
            conn, include_acknowledged=include_all, kind=kind, limit=limit, undelivered=undelivered
        )
    )
    if output == "json":
        click.echo(to_json(found))
        return
    if undelivered:
        _print_undelivered(found)
        return
    columns = list(ALERT_COLUMNS)
    if include_all:
        columns.append(Column("acknowledged by", drop=4))
    print_table(
        f"{len(found)} {'' if include_all else 'open '}alert(s), times UTC",
        columns,
        [
            [
                a["id"],
                a["kind"],
                a["run_id"],
                a["step_id"],
                a["created_at"],
                a["notified_at"],
                a["message"],
                *([a["acknowledged_by"] if a["acknowledged"] else ""] if include_all else []),
            ]
            for a in found
        ],
        now=now,
    )


ALERT_COLUMNS = (
    Column("id", wrap=False, justify="right"),
    Column("kind"),
    Column("run", drop=3, wrap=False, justify="right"),
    Column("step", drop=1, wrap=False, justify="right"),
    Column("created", wrap=False),
    Column("notified", drop=2, wrap=False),
    Column("message"),
)
"""`alerts list`: when narrow, the step id goes first, then the notification time and the run
id (in the message too); the message is never dropped nor cut (it folds)."""


def _print_undelivered(found: list[dict[str, Any]]) -> None:
    """One block per alert: which sinks failed and why, and when it is tried again."""
    click.echo(f"{len(found)} alert(s) a sink failed to take")
    for a in found:
        retry_at = a["retry_at"]
        retry = f"retried at {retry_at.isoformat(timespec='seconds')}" if retry_at else "given up"
        raised = a["created_at"].isoformat(timespec="seconds")
        click.echo(f"alert {a['id']} ({a['kind']}, raised {raised}): {retry}")
        for sink, error in sorted((a["delivery_errors"] or {}).items()):
            click.echo(f"  {sink}: {error}")


@alerts.command("show")
@click.argument("alert_id", type=int)
@OUTPUT_OPTION
@click.pass_obj
def show_command(obj: CliContext, alert_id: int, output: str) -> None:
    """Show every field of one alert."""
    alert = obj.in_transaction(lambda conn: alert_ops.show_alert(conn, alert_id))
    if output == "json":
        click.echo(to_json(alert))
        return
    table = Table("field", "value", title=f"alert {alert_id}", title_justify="left")
    table.columns[1].overflow = "fold"
    for key, value in alert.items():
        table.add_row(key, cell(value, width=100_000))
    Console().print(table)


def _acknowledge(alert_id: int, actor: str, reason: str, conn: Connection) -> dict[str, Any]:
    return alert_ops.acknowledge(conn, alert_id, actor=actor, reason=reason)


@alerts.command("ack")
@click.argument("alert_ids", metavar="[ALERT_ID]...", nargs=-1, type=int)
@click.option(
    "--incident",
    "incident_ids",
    type=int,
    multiple=True,
    help="Acknowledge this incident and all its open alerts (repeatable).",
)
@click.option("--reason", required=True, help="Why (recorded with each alert).")
@click.option(
    "--by", "actor", default=default_actor, show_default="$USER@hostname", help="Who acknowledges."
)
@OUTPUT_OPTION
@click.pass_obj
def ack_command(
    obj: CliContext,
    alert_ids: tuple[int, ...],
    incident_ids: tuple[int, ...],
    reason: str,
    actor: str,
    output: str,
) -> None:
    """Acknowledge open alerts, or incidents with --incident: someone is on it (the same alert
    may then be raised again). Each alert or incident in its own transaction: one that cannot
    be acknowledged (unknown, already acknowledged) is reported and the others still are; the
    exit status is 1 if any failed. With -o json: the alert or incident for one id, else a
    list of each and each {"id", "error"}."""
    if not alert_ids and not incident_ids:
        raise click.UsageError("give at least one ALERT_ID or --incident ID")
    done: list[dict[str, Any]] = []
    lines: list[str] = []
    failed: list[tuple[int, str]] = []
    work = [
        *((i, partial(_acknowledge, i, actor, reason), "alert") for i in dict.fromkeys(alert_ids)),
        *(
            (i, incident_cli.bind(i, actor, reason), "incident")
            for i in dict.fromkeys(incident_ids)
        ),
    ]
    engine = obj.engine("ops", pool_size=1)
    try:
        check_schema(engine)
        for item_id, action, what in work:  # each once, in the order given
            try:
                result = run_transaction(engine, action)
            except (
                AlertNotFoundError,
                AlertAlreadyAcknowledgedError,
                IncidentNotFoundError,
                IncidentAlreadyAcknowledgedError,
            ) as exc:
                failed.append((item_id, str(exc)))
                continue
            done.append(result)
            lines.append(
                f"acknowledged alert {result['id']} ({result['kind']}) as {actor}: {reason}"
                if what == "alert"
                else incident_cli.acknowledged_line(result, actor, reason)
            )
    except SasflowError as exc:  # the database, the schema, the reason: nothing more to try
        raise fail(exc) from exc
    finally:
        engine.dispose()
    if output == "json":
        errors = [{"id": item_id, "error": error} for item_id, error in failed]
        if len(work) > 1:
            click.echo(to_json([*done, *errors]))
        elif done:  # one id: the alert as it is now, as before several could be given
            click.echo(to_json(done[0]))
    else:
        for line in lines:
            click.echo(line)
    for _, error in failed:
        click.echo(f"Error: {error}", err=True)
    if failed:
        raise SystemExit(1)


alerts.add_command(incident_cli.incidents_command)
alerts.add_command(incident_cli.incident_command)
