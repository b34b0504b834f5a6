"""`sasflow events send NAME --correlation C --id ID [--payload JSON]` and `sasflow events list
[--unmatched]` (ops/events.py): inbound events for event waits (docs/concepts.md, "Event
waits"), stored first and matched with their wait whichever comes first."""

from __future__ import annotations

import json
from typing import Any

import click

from sasflow.cli.context import CliContext
from sasflow.cli.output import OUTPUT_OPTION, to_json
from sasflow.ops import events as event_ops
from sasflow.store.db import Connection
from sasflow.store.inbound.ingest import DEFAULT_RETENTION_S


@click.group()
def events() -> None:
    """Inbound events for event waits (Step.wait_for)."""


@events.command("send")
@click.argument("name")
@click.option("--correlation", required=True, help="The value a wait matches (its `match`).")
@click.option(
    "--id", "event_id", required=True, help="The sender's id: the same id twice is one event."
)
@click.option("--payload", default="null", help="JSON: the waiting step's output.")
@click.option(
    "--retention",
    type=float,
    default=DEFAULT_RETENTION_S,
    show_default=True,
    help="Seconds an unmatched event waits for its wait to open.",
)
@click.option("--by", "actor", default="cli", show_default=True, help="Who sends it.")
@OUTPUT_OPTION
@click.pass_obj
def send(
    obj: CliContext,
    name: str,
    correlation: str,
    event_id: str,
    payload: str,
    retention: float,
    actor: str,
    output: str,
) -> None:
    """Send event NAME: stored, and completes the open wait it matches (or the next to open)."""
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from exc
    body = {
        "name": name,
        "correlation": correlation,
        "id": event_id,
        "payload": value,
        "retention": retention,
    }

    def work(conn: Connection) -> dict[str, Any]:
        return event_ops.send_event(
            conn, body, source="cli", namespace=obj.settings.namespace, actor=actor
        )

    done = obj.in_transaction(work)
    if output == "json":
        click.echo(to_json(done))
        return
    said = "stored" if not done["duplicate"] else "already stored"
    matched = (
        f", completed step {done['step_id']} of run {done['run_id']}"
        if done["matched"]
        else ", waiting for its wait to open"
    )
    click.echo(f"event {name} {event_id} {said} (#{done['id']}){matched}")


@events.command("list")
@click.option("--unmatched", is_flag=True, help="Only events no wait consumed yet.")
@click.option("--limit", type=int, default=100, show_default=True)
@OUTPUT_OPTION
@click.pass_obj
def list_events(obj: CliContext, unmatched: bool, limit: int, output: str) -> None:
    """Stored events, newest first, with the run and step each completed."""
    found = obj.in_transaction(
        lambda conn: event_ops.list_events(conn, unmatched=unmatched, limit=limit)
    )
    if output == "json":
        click.echo(to_json(found))
        return
    if not found:
        click.echo("no events")
    for e in found:
        where = (
            f"completed run {e['run_id']} step {e['step']}"
            if e["step_id"] is not None
            else f"unmatched, expires {e['expires_at']}"
        )
        click.echo(
            f"#{e['id']} {e['name']} correlation {e['correlation']} id {e['event_id']} "
            f"({e['source']}, {e['received_at']}): {where}"
        )
