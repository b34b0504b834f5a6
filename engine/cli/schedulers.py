"""`sasflow schedulers list | drain | undrain`: the scheduler cluster and its offline list."""

from __future__ import annotations

import click

from sasflow.cli.context import CliContext
from sasflow.cli.output import OUTPUT_OPTION, print_table, to_json
from sasflow.cli.schedules import BY, REASON
from sasflow.ops import schedulers as ops


@click.group()
def schedulers() -> None:
    """See the scheduler cluster and drain schedulers (docs/cluster.md)."""


@schedulers.command("list")
@OUTPUT_OPTION
@click.pass_obj
def list_command(obj: CliContext, output: str) -> None:
    """Per scheduler: name, address, state, K, S, N, X, M and lease age."""
    found = obj.in_transaction(ops.cluster_view)
    if output == "json":
        click.echo(to_json(found))
        return
    print_table(
        f"{len(found)} scheduler(s)",
        ["name", "address", "state", "K", "S", "N", "X", "M", "lease age"],
        [
            [
                s["name"],
                s["address"],
                s["state"],
                s["K"],
                s["S"],
                s["N"],
                s["X"],
                "unlimited" if s["M"] is None and s["n"] is not None else s["M"],
                None if s["lease_age_s"] is None else f"{s['lease_age_s']:.1f}s",
            ]
            for s in found
        ],
    )


@schedulers.command("drain")
@click.argument("name")
@REASON
@BY
@click.pass_obj
def drain_command(obj: CliContext, name: str, reason: str | None, actor: str) -> None:
    """Put scheduler NAME on the offline list: it stops acquiring and releases each schedule
    once its due tick is submitted; `drained` in the list means it is safe to stop."""
    obj.in_transaction(
        lambda conn: ops.drain(
            conn, name, actor=actor, reason=reason, namespace=obj.names.namespace
        )
    )
    click.echo(f"scheduler {name} is on the offline list (draining)")


@schedulers.command("undrain")
@click.argument("name")
@REASON
@BY
@click.pass_obj
def undrain_command(obj: CliContext, name: str, reason: str | None, actor: str) -> None:
    """Take scheduler NAME off the offline list: it may acquire again, then acquires."""
    obj.in_transaction(
        lambda conn: ops.undrain(
            conn, name, actor=actor, reason=reason, namespace=obj.names.namespace
        )
    )
    click.echo(f"scheduler {name} is off the offline list (online)")
