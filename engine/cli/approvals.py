"""`sasflow approvals list|approve|reject` (ops/approvals.py): approvals (`Step.approval`) are
event waits a person decides (docs/concepts.md, "Approvals"). The command line holds the
database's credentials, so it decides any approval (like a token with `admin`); the actor is
`--by` and every decision is audited."""

from __future__ import annotations

from typing import Any

import click

from sasflow.cli.context import CliContext
from sasflow.cli.output import OUTPUT_OPTION, to_json
from sasflow.cli.runs import BY_OPTION
from sasflow.ops import approvals as approval_ops
from sasflow.ops.tokens import ADMIN

_CLI_SCOPES = (ADMIN,)
"""What the command line holds: the database's credentials decide any approval."""


@click.group()
def approvals() -> None:
    """Approvals (Step.approval): event waits a person decides."""


@approvals.command("list")
@click.option("--workflow", default=None, help="Only this workflow's.")
@click.option("--group", default=None, help="Only this group of approvers' (`approve`: default).")
@click.option("--run", "run_id", type=int, default=None, help="Only this run's.")
@click.option("--limit", type=click.IntRange(1, approval_ops.MAX_LISTED), default=100)
@OUTPUT_OPTION
@click.pass_obj
def list_command(
    obj: CliContext,
    workflow: str | None,
    group: str | None,
    run_id: int | None,
    limit: int,
    output: str,
) -> None:
    """List open approvals, oldest first, with the scope deciding each needs."""
    found = obj.in_transaction(
        lambda conn: approval_ops.list_open(
            conn, workflow=workflow, group=group, run_id=run_id, limit=limit
        )
    )
    if output == "json":
        click.echo(to_json(found))
        return
    if not found:
        click.echo("no open approval")
    for a in found:
        fields = ", ".join(
            f"{name}:{spec['type']}{'' if spec.get('required', True) else '?'}"
            for name, spec in a["form"].items()
        )
        click.echo(
            f"run {a['run_id']} step {a['step']} ({a['workflow']} v{a['version']}, key "
            f"{a['business_key']}): scope {a['scope']}, opened {a['opened_at']}"
            + (f", form {fields}" if fields else "")
        )


def _fields(values: tuple[str, ...]) -> dict[str, str]:
    found: dict[str, str] = {}
    for value in values:
        name, equals, text = value.partition("=")
        if not equals or not name:
            raise click.BadParameter(f"{value!r} is not NAME=VALUE", param_hint="--field")
        found[name] = text
    return found


def _decide(
    obj: CliContext, at: tuple[int, str], decision: approval_ops.Decision, actor: str, output: str
) -> None:
    done = obj.in_transaction(
        lambda conn: approval_ops.decide(
            conn,
            *at,
            decision,
            actor=actor,
            scopes=_CLI_SCOPES,
            namespace=obj.settings.namespace,
        )
    )
    _echo(done, output)


def _echo(done: dict[str, Any], output: str) -> None:
    if output == "json":
        click.echo(to_json(done))
        return
    click.echo(
        f"run {done['run_id']} step {done['step']}: {done['decision']} by {done['by']} "
        f"(step {done['step_state']}, run {done['run_state']})"
    )


@approvals.command("approve")
@click.argument("run_id", type=int)
@click.argument("step")
@click.option("--field", "values", multiple=True, help="A form field, NAME=VALUE (repeat).")
@click.option("--comment", default=None, help="Goes into the step's output and the audit.")
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def approve_command(
    obj: CliContext,
    run_id: int,
    step: str,
    values: tuple[str, ...],
    comment: str | None,
    actor: str,
    output: str,
) -> None:
    """Approve run RUN_ID's open approval STEP with its form's fields: the step is processed
    with them (and decision, by, at, comment) as its output, and the run goes on."""
    decision = approval_ops.Decision("approve", fields=_fields(values), comment=comment)
    _decide(obj, (run_id, step), decision, actor, output)


@approvals.command("reject")
@click.argument("run_id", type=int)
@click.argument("step")
@click.option("--reason", required=True, help="Why (the step's error, and the audit).")
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def reject_command(
    obj: CliContext, run_id: int, step: str, reason: str, actor: str, output: str
) -> None:
    """Reject run RUN_ID's open approval STEP: the step fails (or parks, if its policy parks
    permanent errors) and the run follows its failure policy."""
    _decide(obj, (run_id, step), approval_ops.Decision("reject", reason=reason), actor, output)
