"""`sasflow runs pause|resume ID...` and `sasflow agents pause|resume NAME [--action A]`
(ops/pause.py): nothing new is dispatched for a paused run, or for a paused agent's (action's)
steps, until it is resumed."""

from __future__ import annotations

from typing import Any

import click

from sasflow.cli.context import CliContext
from sasflow.cli.output import OUTPUT_OPTION, to_json
from sasflow.cli.runs import BY_OPTION, REASON_OPTION
from sasflow.ops import pause as pause_ops
from sasflow.store.db import Connection


def _runs(
    obj: CliContext, run_ids: tuple[int, ...], reason: str, actor: str, *, paused: bool
) -> list[dict[str, Any]]:
    def act(conn: Connection) -> list[dict[str, Any]]:
        done = [
            pause_ops.pause_run(conn, run_id, actor=actor, reason=reason, paused=paused)
            for run_id in run_ids
        ]
        if not paused:
            pause_ops.wake(conn, obj.settings.namespace)
        return done

    return obj.in_transaction(act)


def _echo_runs(found: list[dict[str, Any]], output: str) -> None:
    if output == "json":
        click.echo(to_json(found))
        return
    for r in found:
        verb = "paused" if r["paused"] else "resumed"
        already = "" if r["changed"] else " (it was already)"
        click.echo(f"run {r['run_id']} ({r['state']}) {verb}{already}")


@click.command("pause")
@click.argument("run_ids", type=int, nargs=-1, required=True)
@REASON_OPTION
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def pause_runs(
    obj: CliContext, run_ids: tuple[int, ...], reason: str, actor: str, output: str
) -> None:
    """Pause runs (all or none): nothing new is dispatched for them; their steps in flight
    finish and their next steps wait pending, deadlines not started."""
    _echo_runs(_runs(obj, run_ids, reason, actor, paused=True), output)


@click.command("resume")
@click.argument("run_ids", type=int, nargs=-1, required=True)
@REASON_OPTION
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def resume_runs(
    obj: CliContext, run_ids: tuple[int, ...], reason: str, actor: str, output: str
) -> None:
    """Resume paused runs: their ready steps are dispatched again."""
    _echo_runs(_runs(obj, run_ids, reason, actor, paused=False), output)


ACTION_OPTION = click.option("--action", help="Only this action of the agent.")


def _agent(
    obj: CliContext,
    name: str,
    action: str | None,
    reason: str,
    actor: str,
    output: str,
    *,
    paused: bool,
) -> None:
    done = obj.in_transaction(
        lambda conn: pause_ops.pause_agent(
            conn,
            name,
            action=action,
            actor=actor,
            reason=reason,
            namespace=obj.settings.namespace,
            paused=paused,
        )
    )
    if output == "json":
        click.echo(to_json(done))
        return
    what = f"agent {name}" + (f" action {action}" if action else "")
    verb = "paused" if paused else "resumed"
    click.echo(f"{what} {verb}" + ("" if done["changed"] else " (it was already)"))


@click.command("pause")
@click.argument("name")
@ACTION_OPTION
@REASON_OPTION
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def pause_agent(
    obj: CliContext, name: str, action: str | None, reason: str, actor: str, output: str
) -> None:
    """Pause an agent, or one of its actions: no scheduler dispatches its steps, which wait
    pending with their deadlines not started (steps in flight finish)."""
    _agent(obj, name, action, reason, actor, output, paused=True)


@click.command("resume")
@click.argument("name")
@ACTION_OPTION
@REASON_OPTION
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def resume_agent(
    obj: CliContext, name: str, action: str | None, reason: str, actor: str, output: str
) -> None:
    """Resume a paused agent or action (resuming an action leaves a paused agent paused)."""
    _agent(obj, name, action, reason, actor, output, paused=False)
