"""`sasflow queues migrate`: move the work queues to another type (classic <-> quorum)."""

from __future__ import annotations

import click

from sasflow.cli.context import CliContext, fail
from sasflow.cli.output import OUTPUT_OPTION, print_table, to_json
from sasflow.errors import SasflowError
from sasflow.store.cluster.fleet import known_agent_queues
from sasflow.transport.factory import broker_options, is_in_process
from sasflow.transport.migration import QueueMigration, work_queues
from sasflow.transport.queues import QueueOptions, QueueType


@click.group()
def queues() -> None:
    """The broker's work queues."""


@queues.command("migrate")
@click.option(
    "--to",
    "target",
    type=click.Choice([t.value for t in QueueType]),
    required=True,
    help="The queue type to move to (then set SASFLOW_BROKER_QUEUE_TYPE to it for every role).",
)
@click.option(
    "--agent",
    "agents",
    multiple=True,
    help="An agent (or AGENT:POOL) whose queue to move besides those the app and the store "
    "know (repeat).",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@OUTPUT_OPTION
@click.pass_obj
def migrate_command(
    obj: CliContext, target: str, agents: tuple[str, ...], yes: bool, output: str
) -> None:
    """Move every work queue (submit, replies, dead letters, agent and pool queues) to the
    type TARGET without losing a message. Stop every sasflow role first: a queue with a
    consumer is refused. Safe to run again after an interruption
    (docs/howto/production-topology.md)."""
    settings = obj.settings
    if is_in_process(settings.broker_url):
        raise click.UsageError("the in-process bus has no queues to migrate: pass --broker-url")
    names = obj.names
    pairs: set[tuple[str, str | None]] = set(obj.in_transaction(known_agent_queues))
    if settings.app:
        pairs.update((agent.name, None) for agent in obj.registry().agents)
    for entry in agents:
        agent, _, pool = entry.partition(":")
        pairs.add((agent, pool or None))
    planned = work_queues(names, [names.agent_queue(agent, pool) for agent, pool in pairs])
    if not yes:
        click.echo(f"queues to move to {target}:", err=True)
        for queue in planned:
            click.echo(f"  {queue.name}", err=True)
        click.confirm("every sasflow role is stopped; go on?", abort=True, err=True)
    options = broker_options(settings)
    target_options = QueueOptions(
        type=QueueType(target),
        replicas=options.queues.replicas,
        delivery_limit=options.queues.delivery_limit,
    )
    try:
        with QueueMigration(settings.broker_url, options, target_options) as migration:
            migration.check_idle(planned)
            moved = [migration.migrate(queue) for queue in planned]
    except SasflowError as exc:
        raise fail(exc) from exc
    rows = [{"queue": m.queue, "changed": m.changed, "messages_moved": m.messages} for m in moved]
    if output == "json":
        click.echo(to_json(rows))
        return
    print_table(
        f"work queues moved to {target}",
        ["queue", "changed", "messages moved"],
        [[m.queue, "yes" if m.changed else "no (already)", m.messages] for m in moved],
    )
    click.echo(
        f"done: set SASFLOW_BROKER_QUEUE_TYPE={target} for every role before starting them",
        err=True,
    )
