"""`sasflow agents list`: the fleet view of agent instances, from their heartbeats, and the
paused agents and actions (`pause` and `resume` in pause.py)."""

from __future__ import annotations

import click

from sasflow.cli.context import CliContext
from sasflow.cli.lazy import LazyGroup
from sasflow.cli.output import OUTPUT_OPTION, Column, print_table, to_json
from sasflow.ops import agents as agent_ops
from sasflow.ops import pause as pause_ops


@click.group(
    cls=LazyGroup,
    lazy={"pause": "sasflow.cli.pause:pause_agent", "resume": "sasflow.cli.pause:resume_agent"},
)
def agents() -> None:
    """The fleet of agent processes, as their heartbeats report it."""


@agents.command("list")
@click.option("--agent", "agent", help="Only the instances of this agent.")
@click.option("--all", "include_all", is_flag=True, help="Include instances that stopped.")
@OUTPUT_OPTION
@click.pass_obj
def list_command(obj: CliContext, agent: str | None, include_all: bool, output: str) -> None:
    """List agent instances: live, lost (3 missed heartbeats) and, with --all, stopped; a live
    one whose worker threads are all held by handlers past their deadline shows `wedged`."""
    found, paused = obj.in_transaction(
        lambda conn: (
            agent_ops.list_agents(conn, agent=agent, include_stopped=include_all),
            [p for p in pause_ops.paused_agents(conn) if agent is None or p["agent"] == agent],
        )
    )
    if output == "json":
        for instance in found:  # its agent's pauses (action None: the whole agent)
            instance["paused"] = [p for p in paused if p["agent"] == instance["agent"]]
        click.echo(to_json(found))
        return
    print_table(
        f"{len(found)} agent instance(s)",
        [
            "agent",
            Column("instance", drop=3),
            Column("state", wrap=False),
            Column("host", drop=2),
            Column("pid", drop=1, justify="right"),
            Column("in flight", wrap=False),
            Column("last heartbeat", wrap=False),
            Column("breakers", drop=4),
        ],
        [
            [
                i["agent"],
                i["instance_id"],
                i["status"],
                i["hostname"],
                i["pid"],
                f"{i['in_flight']}/{i['concurrency']}",
                f"{i['seconds_since_heartbeat']:.0f}s ago",
                " ".join(f"{d}={s}" for d, s in sorted(i["breakers"].items())) or "-",
            ]
            for i in found
        ],
    )
    for p in paused:
        what = (
            f"{p['agent']} action {p['action']}" if p["action"] else f"{p['agent']} (every action)"
        )
        click.echo(f"paused: {what} by {p['paused_by']}: {p['reason']}")
