"""`sasflow alerts incidents | incident ID`, and `alerts ack --incident ID`'s work: alerts of
one cause grouped while it lasts (docs/alerts.md#incidents)."""

from __future__ import annotations

from functools import partial
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from sasflow.cli.context import CliContext
from sasflow.cli.output import OUTPUT_OPTION, Column, cell, print_table, to_json
from sasflow.ops import incidents as incident_ops
from sasflow.store.db import Connection

INCIDENT_COLUMNS = (
    Column("id", wrap=False, justify="right"),
    Column("count", wrap=False, justify="right"),
    Column("first", drop=2, wrap=False),
    Column("last", wrap=False),
    Column("cause"),
)
"""`alerts incidents`: the workflow is in the cause (and in -o json); when narrow, the first
time goes; the cause is never dropped nor cut (it folds)."""


@click.command("incidents")
@click.option("--all", "include_all", is_flag=True, help="Include acknowledged incidents.")
@click.option("--kind", help="Only this kind (step_failed, agent_outage...).")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@OUTPUT_OPTION
@click.pass_obj
def incidents_command(
    obj: CliContext, include_all: bool, kind: str | None, limit: int, output: str
) -> None:
    """List open incidents, the last seen first: alerts of one cause, counted (`alerts ack
    --incident ID` acknowledges one with all its alerts)."""
    found, now = obj.read(
        lambda conn: incident_ops.list_incidents(
            conn, include_acknowledged=include_all, kind=kind, limit=limit
        )
    )
    if output == "json":
        click.echo(to_json(found))
        return
    columns = list(INCIDENT_COLUMNS)
    if include_all:
        columns.append(Column("acknowledged by", drop=3))
    print_table(
        f"{len(found)} {'' if include_all else 'open '}incident(s), times UTC",
        columns,
        [
            [
                i["id"],
                i["alert_count"],
                i["first_seen"],
                i["last_seen"],
                i["cause"],
                *([i["acknowledged_by"] or ""] if include_all else []),
            ]
            for i in found
        ],
        now=now,
    )


@click.command("incident")
@click.argument("incident_id", type=int)
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@OUTPUT_OPTION
@click.pass_obj
def incident_command(obj: CliContext, incident_id: int, limit: int, output: str) -> None:
    """Show one incident and its alerts, the first raised first (at most --limit)."""
    found, now = obj.read(lambda conn: incident_ops.show_incident(conn, incident_id, limit=limit))
    if output == "json":
        click.echo(to_json(found))
        return
    table = Table("field", "value", title=f"incident {incident_id}", title_justify="left")
    table.columns[1].overflow = "fold"
    for key, value in found.items():
        if key != "alerts":
            table.add_row(key, cell(value, width=100_000))
    Console().print(table)
    print_table(
        f"{len(found['alerts'])} alert(s) of incident {incident_id}, times UTC",
        [
            Column("alert", wrap=False, justify="right"),
            Column("kind", drop=2),
            Column("run", wrap=False, justify="right"),
            Column("key"),
            Column("run state", drop=1, wrap=False),
            Column("raised", wrap=False),
            Column("open", wrap=False),
        ],
        [
            [
                a["id"],
                a["kind"],
                a["run_id"],
                a["business_key"],
                a["run_state"],
                a["created_at"],
                "no" if a["acknowledged"] else "yes",
            ]
            for a in found["alerts"]
        ],
        now=now,
    )


def acknowledge(incident_id: int, actor: str, reason: str, conn: Connection) -> dict[str, Any]:
    """`alerts ack --incident ID`'s transaction."""
    return incident_ops.acknowledge(conn, incident_id, actor=actor, reason=reason)


def acknowledged_line(incident: dict[str, Any], actor: str, reason: str) -> str:
    return (
        f"acknowledged incident {incident['id']} ({incident['alert_count']} alert(s), "
        f"{incident['alerts_acknowledged']} open until now: {incident['cause']}) "
        f"as {actor}: {reason}"
    )


def bind(incident_id: int, actor: str, reason: str) -> Any:
    return partial(acknowledge, incident_id, actor, reason)
