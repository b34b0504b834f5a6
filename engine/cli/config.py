"""`sasflow config show`."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from sasflow.cli.context import CliContext


@click.group()
def config() -> None:
    """Inspect the effective configuration."""


@config.command("show")
@click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.pass_obj
def show(obj: CliContext, output: str) -> None:
    """Print the effective settings, passwords redacted."""
    values = obj.settings.redacted()
    if output == "json":
        click.echo(json.dumps(values, indent=2))
        return
    table = Table("setting", "value", "variable")
    table.columns[0].overflow = "fold"  # long names (broker_blocked_connection_timeout) too
    table.columns[1].overflow = "fold"
    table.columns[2].overflow = "fold"  # variable names are copied: never cut them
    for key, value in values.items():
        table.add_row(key, _shown(value), f"SASFLOW_{key.upper()}")
    Console().print(table)


def _shown(value: object) -> str:
    """A setting as one would write it in its variable (lists comma-separated)."""
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
