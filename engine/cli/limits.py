"""`sasflow limits list | show | set | delete`: flow limits (docs/flow-control.md)."""

from __future__ import annotations

from typing import Any

import click

from sasflow.cli.context import CliContext, default_actor, fail
from sasflow.cli.output import OUTPUT_OPTION, Column, print_table, to_json
from sasflow.errors import InvalidLimitError
from sasflow.ops import limits as ops
from sasflow.store.flow.model import MAX_COUNT, KeyExpr, Limit, format_rate, parse_rate

REASON = click.option("--reason", required=True, help="Why (recorded in the audit trail).")
BY = click.option(
    "--by", "actor", default=default_actor, show_default="$USER@hostname", help="Who acts."
)


@click.group()
def limits() -> None:
    """Rate and concurrency limits, enforced when steps are claimed (docs/flow-control.md)."""


def _selects(limit: dict[str, Any]) -> str:
    if limit["dependency"] is not None:
        return f"{limit['agent']} via {limit['dependency']}"
    if limit["actions"] is not None:
        return f"{limit['agent']}: {', '.join(limit['actions'])}"
    return str(limit["agent"])


def _tokens(state: dict[str, Any]) -> str:
    return "" if state["tokens"] is None else f"{state['tokens']:.1f}"


@limits.command("list")
@OUTPUT_OPTION
@click.pass_obj
def list_command(obj: CliContext, output: str) -> None:
    """Every limit: what it selects, its numbers and its live state."""
    found, now = obj.read(ops.list_limits)
    if output == "json":
        click.echo(to_json(found))
        return
    print_table(
        f"{len(found)} limit(s), times UTC",
        [
            "name",
            "selects",
            "limit",
            Column("in flight", wrap=False),
            Column("tokens", drop=3),
            Column("ready", drop=2),
            Column("last admitted", drop=1),
        ],
        [
            [
                f["name"],
                _selects(f),
                f["description"] + ("" if f["enabled"] else " (disabled)"),
                f["state"]["in_flight"] if f["state"]["resolved"] else "unresolved",
                _tokens(f["state"]),
                f["state"]["ready"],
                f["last_admitted_at"],
            ]
            for f in found
        ],
        now=now,
    )


@limits.command("show")
@click.argument("name")
@OUTPUT_OPTION
@click.pass_obj
def show_command(obj: CliContext, name: str, output: str) -> None:
    """Show limit NAME: its definition, who changed it last and why, and its live state."""
    found = obj.in_transaction(lambda conn: ops.show(conn, name))
    if output == "json":
        click.echo(to_json(found))
        return
    state = found["state"]
    click.echo(f"limit {found['name']}: {_selects(found)}; {found['description']}")
    click.echo(
        f"  {'enabled' if found['enabled'] else 'disabled'}; changed by "
        f"{found['updated_by']} at {found['updated_at'].isoformat(timespec='seconds')}: "
        f"{found['reason'] or ''}"
    )
    if not state["resolved"]:
        click.echo(
            f"  unresolved: no live instance of {found['agent']} reports an action using "
            f"{found['dependency']}; it holds nothing until one does"
        )
        return
    if found["dependency"] is not None:
        click.echo(f"  resolves to actions: {', '.join(state['actions'])}")
    tokens = "" if state["tokens"] is None else f"; {state['tokens']:.1f} call(s) available now"
    click.echo(f"  in flight {state['in_flight']}; ready {state['ready']}{tokens}")
    last = found["last_admitted_at"]
    click.echo(f"  last admitted {last.isoformat(timespec='seconds') if last else 'never'}")
    if state["in_flight_keys"]:
        print_table("busiest keys", ["key", "in flight"], list(state["in_flight_keys"].items()))


@limits.command("set")
@click.argument("name")
@click.option("--agent", required=True, help="The agent whose steps it limits.")
@click.option(
    "--action",
    "actions",
    multiple=True,
    help="Only these actions of the agent (repeat the option) [default: every action].",
)
@click.option(
    "--dependency",
    help="Only the agent's actions that use this dependency (breaker), as its live instances "
    "report them.",
)
@click.option(
    "--key",
    help="One budget per value of: input.<field>[.<field>...] (the run's input), business_key "
    "or workflow [default: one budget].",
)
@click.option("--rate", help="Steps started per period: 100/s, 6000/min, 5/h, 2/day.")
@click.option(
    "--burst",
    type=click.IntRange(1, MAX_COUNT),
    help="Steps that may start at once after an idle period [default: one second of the rate].",
)
@click.option(
    "--concurrency",
    type=click.IntRange(0, MAX_COUNT),
    help="Steps in flight at once (per key with --key); 0 pauses them.",
)
@click.option("--disable", is_flag=True, help="Keep the limit but do not apply it.")
@REASON
@BY
@OUTPUT_OPTION
@click.pass_obj
def set_command(
    obj: CliContext,
    name: str,
    agent: str,
    actions: tuple[str, ...],
    dependency: str | None,
    key: str | None,
    rate: str | None,
    burst: int | None,
    concurrency: int | None,
    disable: bool,
    reason: str,
    actor: str,
    output: str,
) -> None:
    """Create or replace limit NAME (every option not given is unset)."""
    try:
        limit = Limit(
            name=name,
            agent=agent,
            actions=actions or None,
            dependency=dependency,
            key=None if key is None else KeyExpr.parse(key),
            rate=None if rate is None else parse_rate(rate),
            burst=burst,
            concurrency=concurrency,
            enabled=not disable,
        )
    except InvalidLimitError as exc:
        raise fail(exc) from exc
    done = obj.in_transaction(
        lambda conn: ops.set_limit(
            conn, limit, actor=actor, reason=reason, namespace=obj.names.namespace
        )
    )
    if output == "json":
        click.echo(to_json(done))
        return
    verb = "created" if done["created"] else "replaced"
    click.echo(f"limit {name} {verb}: {_selects(done)}; {done['description']}")


@limits.command("delete")
@click.argument("name")
@REASON
@BY
@click.pass_obj
def delete_command(obj: CliContext, name: str, reason: str, actor: str) -> None:
    """Delete limit NAME: its steps are claimed without it from the next claim."""
    gone = obj.in_transaction(
        lambda conn: ops.delete(
            conn, name, actor=actor, reason=reason, namespace=obj.names.namespace
        )
    )
    rate = "" if gone["rate"] is None else f" ({format_rate(gone['rate'])})"
    click.echo(f"limit {gone['name']} deleted{rate}")
