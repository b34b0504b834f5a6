"""`sasflow namespace delete NS`: remove a namespace's queues and exchanges from the broker."""

from __future__ import annotations

import click

from sasflow.cli.context import CliContext, fail
from sasflow.cli.output import OUTPUT_OPTION, print_table, to_json
from sasflow.errors import SasflowError
from sasflow.store.cluster.fleet import known_agent_queues
from sasflow.transport import namespace as ns
from sasflow.transport.admin import BrokerAdmin
from sasflow.transport.factory import broker_options, is_in_process
from sasflow.transport.topology import Names


@click.group()
def namespace() -> None:
    """A namespace's queues and exchanges on the broker."""


@namespace.command("delete")
@click.argument("name")
@click.option(
    "--agent",
    "agents",
    multiple=True,
    help="An agent (or AGENT:POOL) whose queues to delete besides those the app and the "
    "store know (repeat).",
)
@click.option(
    "--store/--no-store",
    default=True,
    show_default=True,
    help="Also delete the queues of the agents and pools the state store knows of (when NAME "
    "is this deployment's SASFLOW_NAMESPACE).",
)
@click.option("--dry-run", is_flag=True, help="Only list what would be deleted.")
@click.option("--yes", is_flag=True, help="Really delete it (its messages are lost).")
@OUTPUT_OPTION
@click.pass_obj
def delete_command(
    obj: CliContext,
    name: str,
    agents: tuple[str, ...],
    store: bool,
    dry_run: bool,
    yes: bool,
    output: str,
) -> None:
    """Delete the queues (with their messages) and exchanges of namespace NAME: the common
    ones, and the agent and pool queues of the agents the app, the store and --agent name.
    Refused while a queue has consumers: stop the namespace's roles first. Preview with
    --dry-run, act with --yes. The database is not touched."""
    if dry_run == yes:
        raise click.UsageError("say --dry-run to list what would be deleted, or --yes to delete")
    settings = obj.settings
    if is_in_process(settings.broker_url):
        raise click.UsageError("the in-process bus keeps no namespace: pass --broker-url")
    pairs: set[tuple[str, str | None]] = set()
    if store and name == settings.namespace:
        pairs.update(obj.in_transaction(known_agent_queues))
    if settings.app:
        pairs.update((agent.name, None) for agent in obj.registry().agents)
    for entry in agents:
        agent, _, pool = entry.partition(":")
        pairs.add((agent, pool or None))
    try:
        with BrokerAdmin(settings.broker_url, broker_options(settings)) as admin:
            found = ns.contents(admin, Names(name), pairs)
            if yes:
                ns.delete(admin, found)
    except SasflowError as exc:
        raise fail(exc) from exc
    done = "deleted" if yes else "would delete"
    if output == "json":
        queues = [
            {"queue": q, "messages": s.messages, "consumers": s.consumers}
            for q, s in found.queues.items()
        ]
        click.echo(
            to_json({done.replace(" ", "_"): {"queues": queues, "exchanges": found.exchanges}})
        )
        return
    print_table(
        f"namespace {name}: {done} {len(found.queues)} queue(s)",
        ["queue", "messages", "consumers"],
        [[q, s.messages, s.consumers] for q, s in found.queues.items()],
    )
    click.echo(f"{done} {len(found.exchanges)} exchange(s): {', '.join(found.exchanges) or '-'}")
    if found.busy and not yes:
        click.echo("queues with consumers (stop the roles first): " + ", ".join(found.busy))
