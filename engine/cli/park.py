"""`sasflow runs unpark|fail ID...` (ops/park.py): a run whose step parked (its failures ran out,
or it answered a permanent error, and its policy parks it) waits for an operator, who unparks
it once the partner is fixed, or fails it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from sasflow.cli.context import CliContext
from sasflow.cli.output import OUTPUT_OPTION, to_json
from sasflow.cli.runs import BY_OPTION, REASON_OPTION
from sasflow.ops import park as park_ops
from sasflow.store.db import Connection

Action = Callable[..., dict[str, Any]]


def _act(
    obj: CliContext, run_ids: tuple[int, ...], reason: str, actor: str, action: Action
) -> list[dict[str, Any]]:
    def act(conn: Connection) -> list[dict[str, Any]]:
        return [
            action(conn, run_id, actor=actor, reason=reason, namespace=obj.settings.namespace)
            for run_id in run_ids
        ]

    return obj.in_transaction(act)


def _echo(found: list[dict[str, Any]], output: str, verb: str) -> None:
    if output == "json":
        click.echo(to_json(found))
        return
    for r in found:
        if r["changed"]:
            click.echo(f"run {r['run_id']} ({r['state']}): {verb} {', '.join(r['steps'])}")
        else:
            click.echo(f"run {r['run_id']} ({r['state']}): no parked step")


@click.command("unpark")
@click.argument("run_ids", type=int, nargs=-1, required=True)
@REASON_OPTION
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def unpark_runs(
    obj: CliContext, run_ids: tuple[int, ...], reason: str, actor: str, output: str
) -> None:
    """Unpark runs (all or none): their parked steps are pending again with a fresh failure
    budget and are dispatched (a run with no parked step is left as it is)."""
    _echo(_act(obj, run_ids, reason, actor, park_ops.unpark_run), output, "unparked")


@click.command("fail")
@click.argument("run_ids", type=int, nargs=-1, required=True)
@REASON_OPTION
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def fail_runs(
    obj: CliContext, run_ids: tuple[int, ...], reason: str, actor: str, output: str
) -> None:
    """Fail parked runs (all or none): their parked steps go to error and each run ends as its
    failure policy says (error with an alert, or compensation). A run with no parked step is
    refused."""
    _echo(_act(obj, run_ids, reason, actor, park_ops.fail_run), output, "failed")
