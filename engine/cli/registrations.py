"""`sasflow schedulers list | drain | undrain`: the scheduler cluster and its offline list."""

from __future__ import annotations

import click

from sasflow.cli.context import CliContext
from sasflow.cli.output import OUTPUT_OPTION, print_table, to_json
from sasflow.cli.schedules import BY, REASON
from sasflow.ops import registrations


@click.group()
def schedulers() -> None:
    """See the scheduler cluster and drain schedulers (docs/cluster.md)."""


@schedulers.command("list")
@OUTPUT_OPTION
@click.pass_obj
def list_command(obj: CliContext, output: str) -> None:
    """Per scheduler: name, address, state, K, S, N, X, M and lease age; with the scope
    strategy also the leader (*), the plan epoch and each scheduler's range."""
    found = obj.in_transaction(registrations.cluster_view)
    if output == "json":
        click.echo(to_json(found))
        return
    scope = any(s["assignment"] == "scope" for s in found)
    print_table(
        f"{len(found)} scheduler(s)",
        ["name", "address", "state", "K", "S", "N", "X", "M", "lease age"]
        + (["leader", "epoch", "range"] if scope else []),
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
            + (["*" if s["leader"] else "", s["epoch"], s["range"]] if scope else [])
            for s in found
        ],
    )


@schedulers.command("plan")
@OUTPUT_OPTION
@click.pass_obj
def plan_command(obj: CliContext, output: str) -> None:
    """The scope strategy's current plan: epoch, leader, and each scheduler's range of the
    schedules ordered by id (positions and ids)."""
    plan = obj.in_transaction(registrations.plan_view)
    if output == "json":
        click.echo(to_json(plan))
        return
    if plan["state"] == "none":
        click.echo("no plan: no scheduler runs with --assignment scope")
        return
    print_table(
        f"plan epoch {plan['epoch']} ({plan['state']}), leader {plan['leader'] or 'none'}, "
        f"K={plan['K']} S={plan['S']}",
        ["#", "name", "address", "range", "size", "ids"],
        [
            [
                r["position"],
                r["name"],
                r["address"],
                registrations.range_text(r["first"], r["last"]),
                r["size"],
                f"{r['lo_id'] or '..'}-{r['hi_id'] or '..'}",
            ]
            for r in plan["ranges"]
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
        lambda conn: registrations.drain(
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
        lambda conn: registrations.undrain(
            conn, name, actor=actor, reason=reason, namespace=obj.names.namespace
        )
    )
    click.echo(f"scheduler {name} is off the offline list (online)")
