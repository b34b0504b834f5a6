"""`sasflow audit list`: the audit trail of actions that have no run to record an event on."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from sasflow.cli.context import CliContext
from sasflow.cli.output import OUTPUT_OPTION, cell, parse_moment, to_json
from sasflow.ops import audit as audit_ops


@click.group()
def audit() -> None:
    """Read the audit trail (dead letters replayed, purged or expired, runs pruned, tokens,
    limits, schedules, drained schedulers, expired subscribers)."""


@audit.command("list")
@click.option("--since", help="Created at or after: 15m, 2h, 3d or an ISO-8601 time.")
@click.option("--actor", help="Only this actor (exactly: alice@ops-1, a token's name...).")
@click.option(
    "--action",
    help="Only this action (dead.purge), or a family of them (dead, runs, tokens...).",
)
@click.option(
    "--limit",
    type=click.IntRange(1, audit_ops.MAX_LIMIT),
    default=100,
    show_default=True,
    help="Newest records shown at most.",
)
@OUTPUT_OPTION
@click.pass_obj
def list_command(
    obj: CliContext,
    since: str | None,
    actor: str | None,
    action: str | None,
    limit: int,
    output: str,
) -> None:
    """List audit records, newest first (kept SASFLOW_RETAIN_AUDIT_DAYS days)."""
    where = audit_ops.AuditFilter(
        since=parse_moment(since), actor=actor, action=action, limit=limit
    )
    found = obj.in_transaction(lambda conn: audit_ops.list_audit(conn, where))
    if output == "json":
        click.echo(to_json(found))
        return
    Console().print(_table(found))


def _table(found: list[dict[str, Any]]) -> Table:
    """Readable at 80 columns: id, time and action never wrap; the actor and the reason with
    a digest of the detail fold (`-o json` has every field whole)."""
    table = Table(title=f"{len(found)} audit record(s)", title_justify="left")
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("at (UTC)", no_wrap=True)
    table.add_column("action", no_wrap=True)
    table.add_column("actor", overflow="fold", max_width=30)
    table.add_column("reason · detail", overflow="fold", ratio=1)
    for record in found:
        at = record["created_at"]
        when = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M") if isinstance(at, datetime) else ""
        digest = _digest(record["detail"])
        text = " · ".join(part for part in (record["reason"] or "", digest) if part)
        table.add_row(str(record["id"]), when, record["action"], record["actor"], text)
    return table


DETAIL_CHARS = 40
"""A value of the detail in the digest is cut after this many characters (whole in -o json)."""


def _digest(detail: Any) -> str:
    """`key=value` pairs of the detail, lists as their length (ids are in `-o json`)."""
    if not isinstance(detail, dict):
        return "" if detail is None else cell(detail)
    parts = []
    for key, value in detail.items():
        shown = len(value) if isinstance(value, list) else value
        text = cell(shown, DETAIL_CHARS)
        cut = text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"
        parts.append(f"{key}={cut}")
    return " ".join(parts)
