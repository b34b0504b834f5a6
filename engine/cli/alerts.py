"""`sasflow alerts list | show | ack`: what the supervisor raised, and the operator's answer."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from sasflow.cli.context import CliContext, default_actor
from sasflow.cli.output import OUTPUT_OPTION, Column, cell, print_table, to_json
from sasflow.ops import alerts as alert_ops


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


@alerts.command("ack")
@click.argument("alert_id", type=int)
@click.option("--reason", required=True, help="Why (recorded with the alert).")
@click.option(
    "--by", "actor", default=default_actor, show_default="$USER@hostname", help="Who acknowledges."
)
@OUTPUT_OPTION
@click.pass_obj
def ack_command(obj: CliContext, alert_id: int, reason: str, actor: str, output: str) -> None:
    """Acknowledge an open alert: someone is on it (the same alert may then be raised again)."""
    alert = obj.in_transaction(
        lambda conn: alert_ops.acknowledge(conn, alert_id, actor=actor, reason=reason)
    )
    if output == "json":
        click.echo(to_json(alert))
        return
    click.echo(f"acknowledged alert {alert_id} ({alert['kind']}) as {actor}: {reason}")
