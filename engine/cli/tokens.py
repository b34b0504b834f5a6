"""`sasflow tokens create | list | revoke`: the HTTP API's bearer tokens."""

from __future__ import annotations

import click

from sasflow.cli.context import CliContext, default_actor
from sasflow.cli.output import OUTPUT_OPTION, Column, print_table, to_json
from sasflow.ops import tokens as token_ops


@click.group()
def tokens() -> None:
    """Create, list and revoke the HTTP API's bearer tokens."""


@tokens.command("create")
@click.option("--name", required=True, help="Who uses it: the actor of its audited actions.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    required=True,
    help="What it may do (repeat): submit, read, operate, approve, approve:GROUP (approvals "
    "of that group of approvers only), admin (all of them).",
)
@click.option("--actor", default=None, help="Who creates it [default: $USER@hostname].")
@OUTPUT_OPTION
@click.pass_obj
def create_command(
    obj: CliContext, name: str, scopes: tuple[str, ...], actor: str | None, output: str
) -> None:
    """Create a token and print its secret, which is shown this once only."""
    made = obj.in_transaction(
        lambda conn: token_ops.create(
            conn, name=name, scopes=scopes, actor=actor or default_actor()
        )
    )
    if output == "json":
        click.echo(to_json({"token": made.secret, **made.token}))
        return
    click.echo(made.secret)
    click.echo(
        f"token {name!r} ({', '.join(made.token['scopes'])}) created: keep the secret above, "
        "it is not stored and cannot be shown again",
        err=True,
    )


@tokens.command("list")
@click.option("--all", "include_all", is_flag=True, help="Include revoked tokens.")
@OUTPUT_OPTION
@click.pass_obj
def list_command(obj: CliContext, include_all: bool, output: str) -> None:
    """List tokens (names and scopes; secrets are never stored)."""
    found, now = obj.read(lambda conn: token_ops.list_tokens(conn, include_revoked=include_all))
    if output == "json":
        click.echo(to_json(found))
        return
    print_table(
        f"{len(found)} token(s), times UTC",
        [
            Column("id", drop=2, justify="right"),
            "name",
            "scopes",
            Column("created", drop=3),
            Column("by", drop=1),
            "revoked",
        ],
        [
            [
                t["id"],
                t["name"],
                ", ".join(t["scopes"]),
                t["created_at"],
                t["created_by"],
                t["revoked_at"],
            ]
            for t in found
        ],
        now=now,
    )


@tokens.command("revoke")
@click.argument("name")
@click.option("--reason", required=True, help="Why (recorded in the audit trail).")
@click.option("--actor", default=None, help="Who revokes it [default: $USER@hostname].")
@click.pass_obj
def revoke_command(obj: CliContext, name: str, reason: str, actor: str | None) -> None:
    """Revoke the live token NAME: requests with it get 401 from then on."""
    obj.in_transaction(
        lambda conn: token_ops.revoke(conn, name, actor=actor or default_actor(), reason=reason)
    )
    click.echo(f"token {name!r} revoked")
