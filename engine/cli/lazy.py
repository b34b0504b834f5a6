"""A click group that imports a subcommand's module only when that subcommand runs.

`sasflow agent` then does not import Alembic (db), rich's live display (demo) or the operator
commands: a role process starts ~0.3 s sooner, which a restarted agent or scheduler spends
away from its work. The pattern is click's own ("Lazily Loading Subcommands" in its docs).
"""

from __future__ import annotations

import importlib

import click


class LazyGroup(click.Group):
    """`lazy` maps a subcommand's name to `module:attribute` of its click command."""

    def __init__(self, *args: object, lazy: dict[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command
