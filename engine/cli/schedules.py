"""`sasflow schedules add | list | show | pause | resume | remove | trigger | release`."""

from __future__ import annotations

from typing import Any

import click

from sasflow.cli.context import CliContext, default_actor, fail
from sasflow.cli.output import OUTPUT_OPTION, Column, error_text, print_table, to_json
from sasflow.errors import InvalidMessageError, InvalidScheduleError
from sasflow.messages import loads
from sasflow.ops import schedules as ops
from sasflow.schedules.definition import DEFAULT_MAX_CATCH_UP, Schedule
from sasflow.schedules.timing import CatchUp
from sasflow.store.db import Connection

REASON = click.option("--reason", default=None, help="Why (recorded in the audit trail).")
BY = click.option(
    "--by", "actor", default=default_actor, show_default="$USER@hostname", help="Who acts."
)


@click.group()
def schedules() -> None:
    """Define and operate recurring schedules (docs/schedules.md)."""


@schedules.command("add")
@click.argument("name")
@click.option("--workflow", required=True, help="Workflow each tick submits (from --app).")
@click.option("--input", "input_json", default="{}", show_default=True, help="Run input (JSON).")
@click.option("--cron", help="Cron expression: 5 fields, or 6 with seconds last.")
@click.option("--every", type=click.IntRange(1), help="Or a fixed interval, in seconds.")
@click.option("--timezone", default="UTC", show_default=True, help="Time zone of --cron.")
@click.option(
    "--catch-up",
    type=click.Choice([c.value for c in CatchUp]),
    default=CatchUp.LATEST.value,
    show_default=True,
    help="Ticks missed while no scheduler held it: fire the newest, all (bounded), or none.",
)
@click.option(
    "--max-catch-up",
    type=click.IntRange(1, 100_000),
    default=DEFAULT_MAX_CATCH_UP,
    show_default=True,
    help="At most this many missed ticks fired under --catch-up all.",
)
@REASON
@BY
@OUTPUT_OPTION
@click.pass_obj
def add_command(
    obj: CliContext,
    name: str,
    workflow: str,
    input_json: str,
    cron: str | None,
    every: int | None,
    timezone: str,
    catch_up: str,
    max_catch_up: int,
    reason: str | None,
    actor: str,
    output: str,
) -> None:
    """Add schedule NAME: submit --workflow at every --cron tick or --every seconds."""
    try:
        value = loads(
            input_json.encode("utf-8", "replace"), obj.settings.limits(), what="the input"
        )
    except InvalidMessageError as exc:
        raise click.BadParameter(str(exc), param_hint="--input") from exc
    try:
        schedule = Schedule(
            name=name,
            workflow=workflow,
            cron=cron,
            every=every,
            input=value,
            timezone=timezone,
            catch_up=catch_up,
            max_catch_up=max_catch_up,
        )
    except InvalidScheduleError as exc:
        raise fail(exc) from exc
    registry = obj.registry()
    row = obj.in_transaction(
        lambda conn: ops.add(
            conn, schedule, registry, actor=actor, reason=reason, namespace=obj.names.namespace
        )
    )
    if output == "json":
        click.echo(to_json(row))
        return
    click.echo(f"schedule {row['id']} ({name}) added; next tick {row['next_tick_at'].isoformat()}")


@schedules.command("list")
@OUTPUT_OPTION
@click.pass_obj
def list_command(obj: CliContext, output: str) -> None:
    """List every schedule, its timing, owner and next tick."""
    found, now = obj.read(ops.list_schedules)
    if output == "json":
        click.echo(to_json(found))
        return
    print_table(
        f"{len(found)} schedule(s), times UTC",
        [
            Column("id", drop=3, justify="right"),
            "name",
            Column("workflow", drop=4),
            "timing",
            Column("catch-up", drop=1),
            Column("paused", drop=5),
            Column("owner", drop=6),
            "next tick",
            Column("last tick", drop=2),
        ],
        [
            [
                s["id"],
                s["name"],
                s["workflow"],
                _timing(s),
                s["catch_up"],
                "yes" if s["paused"] else "",
                _owner(s),
                s["next_tick_at"],
                s["last_tick_at"],
            ]
            for s in found
        ],
        now=now,
    )


def _timing(schedule: dict[str, Any]) -> str:
    if schedule["cron"] is not None:
        return f"{schedule['cron']} ({schedule['timezone']})"
    return f"every {int(schedule['interval_s'])}s"


def _owner(schedule: dict[str, Any]) -> str:
    if schedule["owner"] is None:
        return ""
    name = schedule["owner_name"] or schedule["owner"]
    return name if schedule["owner_live"] else f"{name} (dead)"


@schedules.command("show")
@click.argument("ref")
@click.option("--ticks", type=click.IntRange(1, 1000), default=ops.SHOWN_TICKS, show_default=True)
@OUTPUT_OPTION
@click.pass_obj
def show_command(obj: CliContext, ref: str, ticks: int, output: str) -> None:
    """Show schedule REF (id or name): its definition, last ticks and their runs, next tick."""
    found, now = obj.read(lambda conn: ops.show(conn, ref, ticks=ticks))
    if output == "json":
        click.echo(to_json(found))
        return
    click.echo(f"schedule {found['id']} {found['name']}: {found['workflow']}, {found['timing']}")
    click.echo(f"  input {to_json(found['input'])}")
    click.echo(
        f"  catch-up {found['catch_up']} (max {found['max_catch_up']}); "
        f"{'paused' if found['paused'] else 'active'}; owner {found['owner'] or 'none'}"
    )
    click.echo(f"  next tick {found['next_tick_at'].isoformat()}")
    print_table(
        "last ticks, times UTC",
        ["tick", "run", Column("fired by", drop=1), Column("fired at", drop=2), "error"],
        [
            [t["tick_at"], t["run_id"], t["fired_by"], t["fired_at"], error_text(t["error"])]
            for t in found["ticks"]
        ],
        now=now,
    )


DONE = {"pause": "paused", "resume": "resumed", "remove": "removed", "release": "released"}


def _simple(verb: str, help_text: str) -> None:
    """Register `sasflow schedules VERB REF` (pause, resume, remove, release)."""

    @schedules.command(verb, help=help_text)
    @click.argument("ref")
    @REASON
    @BY
    @click.pass_obj
    def command(obj: CliContext, ref: str, reason: str | None, actor: str) -> None:
        namespace = obj.names.namespace

        def work(conn: Connection) -> dict[str, Any]:
            if verb in {"pause", "resume"}:
                return ops.set_paused(
                    conn,
                    ref,
                    paused=verb == "pause",
                    actor=actor,
                    reason=reason,
                    namespace=namespace,
                )
            action = ops.remove if verb == "remove" else ops.release
            return action(conn, ref, actor=actor, reason=reason, namespace=namespace)

        schedule = obj.in_transaction(work)
        click.echo(f"schedule {schedule['id']} ({schedule['name']}) {DONE[verb]}")


_simple("pause", "Pause schedule REF (id or name): no tick fires until it is resumed.")
_simple(
    "resume", "Resume schedule REF from its next tick (ticks missed while paused are not fired)."
)
_simple("remove", "Delete schedule REF and its tick history (its runs stay).")
_simple("release", "Free schedule REF from its scheduler, for any scheduler to acquire.")


@schedules.command("trigger")
@click.argument("ref")
@REASON
@BY
@OUTPUT_OPTION
@click.pass_obj
def trigger_command(obj: CliContext, ref: str, reason: str | None, actor: str, output: str) -> None:
    """Fire schedule REF (id or name) now, once."""
    registry = obj.registry()
    fired = obj.in_transaction(
        lambda conn: ops.trigger(
            conn, ref, registry, actor=actor, reason=reason, namespace=obj.names.namespace
        )
    )
    if output == "json":
        click.echo(to_json(fired))
        return
    tick = fired["tick"] or {}
    if fired["run_id"] is None:
        raise click.ClickException(f"tick not submitted: {tick.get('error')}")
    click.echo(f"schedule {fired['schedule_id']} ({fired['name']}) fired: run {fired['run_id']}")
