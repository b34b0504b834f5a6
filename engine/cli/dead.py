"""`sasflow dead list | show | replay | purge`: the dead-letter queues, for operators."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from sasflow.cli.context import CliContext, default_actor
from sasflow.cli.output import OUTPUT_OPTION, Column, cell, parse_moment, print_table, to_json
from sasflow.ops import dead as dead_ops
from sasflow.redact import redact_url
from sasflow.store.db import Connection
from sasflow.transport.base import Transport
from sasflow.transport.factory import is_in_process

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

BY_OPTION = click.option(
    "--by",
    "actor",
    default=default_actor,
    show_default="$USER@host",
    help="Who acts (recorded in the audit trail).",
)
REASON_OPTION = click.option("--reason", required=True, help="Why (recorded in the audit trail).")
QUEUE_OPTION = click.option(
    "--queue",
    type=click.Choice(["dead", "requests"]),
    default="dead",
    show_default=True,
    help="dead: <ns>.dead, every dead letter; requests: <ns>.dead.requests, the supervisor's "
    "copy of dead-lettered requests (it empties it every sweep).",
)
SCAN_OPTION = click.option(
    "--scan-limit",
    type=click.IntRange(1, 1_000_000),
    default=dead_ops.SCAN_LIMIT,
    show_default=True,
    help="Messages taken from the queue at most (held unacked while the command runs).",
)


def parse_duration(text: str | None, option: str) -> float | None:
    """`90s`, `15m`, `2h`, `3d` as seconds."""
    value = parse_moment(text)
    if value is not None and not isinstance(value, float):
        raise click.BadParameter(f"{text!r} is not a duration like 15m/2h/3d", param_hint=option)
    return value


def _filter_options(command: F) -> F:
    for option in reversed(
        [
            click.option(
                "--reason-contains", "reason_contains", help="Reason contains (any case)."
            ),
            click.option(
                "--source", help="Source queue, with or without the namespace (submit, replies)."
            ),
            click.option("--older-than", help="Dead-lettered more than 15m, 2h, 3d... ago."),
            click.option("--newer-than", help="Dead-lettered less than 15m, 2h, 3d... ago."),
            QUEUE_OPTION,
            SCAN_OPTION,
        ]
    ):
        command = option(command)
    return command


def _where(
    ids: tuple[str, ...],
    reason_contains: str | None,
    source: str | None,
    older_than: str | None,
    newer_than: str | None,
    limit: int | None = None,
) -> dead_ops.DeadFilter:
    return dead_ops.DeadFilter(
        ids=ids,
        reason=reason_contains,
        source=source,
        older_than_s=parse_duration(older_than, "--older-than"),
        newer_than_s=parse_duration(newer_than, "--newer-than"),
        limit=limit,
    )


def _with_broker(obj: CliContext, work: Callable[[Connection, Transport], T]) -> T:
    """`work` with a transaction (the clock, the audit row) and a broker connection."""
    if is_in_process(obj.settings.broker_url):
        raise click.UsageError(
            f"the broker URL {redact_url(obj.settings.broker_url)!r} is the in-process bus: "
            "its dead letters live inside the process that ran it (sasflow demo, sasflow run); "
            "sasflow dead needs RabbitMQ (--broker-url amqp://... or SASFLOW_BROKER_URL)"
        )
    transport = obj.transport("dead")
    return obj.in_transaction(lambda conn: work(conn, transport))


@click.group()
def dead() -> None:
    """Inspect, replay and purge dead-lettered messages (RabbitMQ only)."""


@dead.command("list")
@_filter_options
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=100, show_default=True)
@OUTPUT_OPTION
@click.pass_obj
def list_command(
    obj: CliContext,
    reason_contains: str | None,
    source: str | None,
    older_than: str | None,
    newer_than: str | None,
    queue: str,
    scan_limit: int,
    limit: int,
    output: str,
) -> None:
    """List dead letters, oldest first: why, where from, how old, and the start of the body."""
    where = _where((), reason_contains, source, older_than, newer_than, limit)
    scan = _with_broker(
        obj,
        lambda conn, transport: dead_ops.list_dead(
            conn, transport, obj.names, where, queue=queue, scan_limit=scan_limit
        ),
    )
    if output == "json":
        click.echo(
            to_json(
                {
                    "scanned": scan.scanned,
                    "truncated": scan.truncated,
                    "dead_letters": [le.summary() for le in scan.letters],
                }
            )
        )
        return
    more = f" (only the first {scan.scanned:,} scanned)" if scan.truncated else ""
    print_table(
        f"{len(scan.letters)} dead letter(s) of {scan.scanned} in the queue{more}",
        [
            Column("id", wrap=False),
            Column("source queue", drop=3),
            Column("age", wrap=False),
            "reason",
            Column("headers", drop=1),
            Column("body", drop=2),
        ],
        [
            [
                le.id,
                le.source_queue,
                _age(le.age_s),
                le.reason,
                {k: v for k, v in le.headers.items() if k != "x-death"},
                le.summary(body_chars=120)["body"],
            ]
            for le in scan.letters
        ],
    )


@dead.command("show")
@click.argument("dead_id")
@QUEUE_OPTION
@OUTPUT_OPTION
@click.pass_obj
def show_command(obj: CliContext, dead_id: str, queue: str, output: str) -> None:
    """Show one dead letter whole: every header and the pretty-printed body."""
    letter = _with_broker(
        obj,
        lambda conn, transport: dead_ops.show_dead(
            conn, transport, obj.names, dead_id, queue=queue
        ),
    )
    shown = letter.summary(body_chars=None)
    if output == "json":
        click.echo(to_json(shown))
        return
    table = Table("field", "value", title=f"dead letter {dead_id}", title_justify="left")
    table.columns[1].overflow = "fold"
    for key, value in shown.items():
        if key == "body":
            continue
        table.add_row(key, cell(value, width=100_000))
    Console().print(table)
    click.echo(shown["body"])


def _act(
    obj: CliContext,
    action: Callable[..., dead_ops.Acted],
    ids: tuple[str, ...],
    where: dead_ops.DeadFilter,
    *,
    dry_run: bool,
    yes: bool,
    **kwargs: Any,
) -> dead_ops.Acted:
    if not ids and not dry_run and not yes:
        raise click.UsageError("without ids, give --dry-run to preview or --yes to act")
    if ids and yes:
        raise click.UsageError("--yes is for filters without ids (ids act at once)")
    return _with_broker(
        obj,
        lambda conn, transport: action(
            conn, transport, obj.names, where, dry_run=dry_run, **kwargs
        ),
    )


def _report(acted: dead_ops.Acted, verb: str, past: str, output: str) -> None:
    if output == "json":
        click.echo(
            to_json(
                {
                    "dry_run": acted.dry_run,
                    "count": len(acted.done),
                    "ids": [le.id for le in acted.done],
                    "failed": [{"id": le.id, "error": e} for le, e in acted.failed],
                    "skipped": [
                        {"id": le.id, "source_queue": le.source_queue, "why": why}
                        for le, why in acted.skipped
                    ],
                    "truncated": acted.truncated,
                    "audit_id": acted.audit_id,
                }
            )
        )
    else:
        said = f"would {verb}" if acted.dry_run else past
        click.echo(
            f"{said} {len(acted.done)} dead letter(s): {' '.join(le.id for le in acted.done)}"
        )
        for letter, why in acted.skipped:
            source = f" (from {letter.source_queue})" if letter.source_queue else ""
            click.echo(f"skipped {letter.id}{source}: {why}")
        for letter, error in acted.failed:
            click.echo(f"failed {letter.id}: {error}", err=True)
    if acted.failed:
        raise SystemExit(1)


@dead.command("replay")
@click.argument("ids", nargs=-1)
@REASON_OPTION
@_filter_options
@click.option(
    "--dry-run",
    is_flag=True,
    help="Only list the dead letters that would be replayed, and those skipped with why.",
)
@click.option("--yes", is_flag=True, help="Without ids: really replay every matching one.")
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def replay_command(
    obj: CliContext,
    ids: tuple[str, ...],
    reason: str,
    reason_contains: str | None,
    source: str | None,
    older_than: str | None,
    newer_than: str | None,
    queue: str,
    scan_limit: int,
    dry_run: bool,
    yes: bool,
    actor: str,
    output: str,
) -> None:
    """Put dead letters back into their source queue once their cause is fixed: the given IDS,
    or every one the filters select (preview with --dry-run, act with --yes). Submissions and
    replies only: a dead-lettered request is recovered by resubmitting its run."""
    where = _where(ids, reason_contains, source, older_than, newer_than)
    acted = _act(
        obj,
        dead_ops.replay,
        ids,
        where,
        dry_run=dry_run,
        yes=yes,
        actor=actor,
        reason=reason,
        queue=queue,
        scan_limit=scan_limit,
    )
    _report(acted, "replay", "replayed", output)


@dead.command("purge")
@click.argument("ids", nargs=-1)
@REASON_OPTION
@_filter_options
@click.option("--dry-run", is_flag=True, help="Only list the dead letters that would be removed.")
@click.option("--yes", is_flag=True, help="Without ids: really remove every matching one.")
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def purge_command(
    obj: CliContext,
    ids: tuple[str, ...],
    reason: str,
    reason_contains: str | None,
    source: str | None,
    older_than: str | None,
    newer_than: str | None,
    queue: str,
    scan_limit: int,
    dry_run: bool,
    yes: bool,
    actor: str,
    output: str,
) -> None:
    """Remove dead letters for good: the given IDS, or every one the filters select (preview
    with --dry-run, act with --yes)."""
    where = _where(ids, reason_contains, source, older_than, newer_than)
    acted = _act(
        obj,
        dead_ops.purge,
        ids,
        where,
        dry_run=dry_run,
        yes=yes,
        actor=actor,
        reason=reason,
        queue=queue,
        scan_limit=scan_limit,
    )
    _report(acted, "purge", "purged", output)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
