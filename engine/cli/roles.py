"""`sasflow submitter | scheduler | agent`: the long-running processes."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import click

from sasflow.agents.agent import Agent
from sasflow.agents.children import ChildProcesses, default_state_dir
from sasflow.agents.wedge import WEDGED_EXIT_CODE, WedgeOptions
from sasflow.agents.worker import DEFAULT_CONCURRENCY, AgentOptions, AgentWorker
from sasflow.appload import load_object
from sasflow.backpressure import SUBMITTER_POLICIES, SubmitterBackpressure, SubmitterPolicy
from sasflow.cli.context import (
    CliContext,
    check_definitions,
    check_not_refused,
    role_failed,
    stop_event,
)
from sasflow.errors import SasflowError
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.scheduler.advancing import AdvanceOptions
from sasflow.scheduler.cluster.member import ClusterOptions
from sasflow.scheduler.cluster.strategy import ASSIGNMENTS
from sasflow.scheduler.usercode import UserCodeOptions
from sasflow.store.db import Engine
from sasflow.store.runs.pools import PoolLimits
from sasflow.submitter import DEFAULT_PREFETCH, Submitter


@click.command()
@click.option(
    "--prefetch",
    type=click.IntRange(1, 10000),
    default=DEFAULT_PREFETCH,
    show_default=True,
    envvar="SASFLOW_SUBMITTER_PREFETCH",
    show_envvar=True,
    help="Submissions held (and inserted per transaction) at once.",
)
@click.option(
    "--on-backlog",
    type=click.Choice(SUBMITTER_POLICIES),
    default=SubmitterBackpressure.policy,
    show_default=True,
    envvar="SASFLOW_SUBMITTER_ON_BACKLOG",
    show_envvar=True,
    help="Past a workflow's bound (SASFLOW_MAX_BACKLOG or its max_backlog): hold the "
    "submissions in <ns>.submit until there is room, dead-letter them (reject), or record "
    "them anyway (accept).",
)
@click.pass_obj
def submitter(obj: CliContext, prefetch: int, on_backlog: SubmitterPolicy) -> None:
    """Consume <ns>.submit and record each submission as a run (idempotent on its key)."""
    engine: Engine | None = None
    try:
        # Refuses memory:// (and a broker list that cannot work) before any connection.
        transport = obj.transport("submitter", long_running=True)
        engine = obj.engine("submitter")
        check_not_refused(engine)  # it touches the database only when a submission arrives
        registry = obj.registry()
        check_definitions(engine, registry, actor="submitter")
        role = Submitter(
            engine,
            transport,
            registry,
            obj.names,
            prefetch=prefetch,
            limits=obj.settings.limits(),
            stop=stop_event(),
            hooks=obj.hooks("submitter"),
            backpressure=SubmitterBackpressure(
                max_backlog=obj.settings.max_backlog, policy=on_backlog
            ),
        )
        role.run()
    except SasflowError as exc:
        raise role_failed(exc) from exc
    finally:
        if engine is not None:
            engine.dispose()


@click.command()
@click.option(
    "--batch",
    type=click.IntRange(1, 10000),
    default=SchedulerOptions.claim_batch,
    show_default=True,
    envvar="SASFLOW_SCHEDULER_BATCH",
    show_envvar=True,
    help="Steps claimed per statement.",
)
@click.option(
    "--reply-prefetch",
    type=click.IntRange(1, 10000),
    default=SchedulerOptions.reply_prefetch,
    show_default=True,
    envvar="SASFLOW_SCHEDULER_REPLY_PREFETCH",
    show_envvar=True,
    help="Replies held (and applied per transaction) at once.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(0, 1_000_000),
    default=SchedulerOptions.max_in_flight,
    show_default=True,
    envvar="SASFLOW_SCHEDULER_MAX_IN_FLIGHT",
    show_envvar=True,
    help="Steps of one agent kept in flight (dispatched, no reply yet) before the agent is "
    "left out of claims; 0: no bound.",
)
@click.option(
    "--fleet-bound/--no-fleet-bound",
    default=SchedulerOptions.fleet_bound,
    show_default=True,
    envvar="SASFLOW_SCHEDULER_FLEET_BOUND",
    show_envvar=True,
    help="Claim no step of an agent whose instances are all gone (stopped or lost): they stay "
    "pending, uncharged, until one is back (docs/flow-control.md).",
)
@click.option(
    "--fleet-bound-factor",
    type=click.FloatRange(0.1, 10_000),
    default=SchedulerOptions.fleet_bound_factor,
    envvar="SASFLOW_SCHEDULER_FLEET_BOUND_FACTOR",
    show_envvar=True,
    help="Also keep each agent's steps in flight, cluster-wide, within this many per unit of "
    "its live instances' capacity (summed concurrency), e.g. 2 for slow handlers "
    "[default: no such bound].",
)
@click.option(
    "--rescan-interval",
    type=click.FloatRange(0.05, 60),
    default=None,
    envvar="SASFLOW_SCHEDULER_RESCAN_INTERVAL",
    show_envvar=True,
    help="Seconds between claims when no notification woke us "
    "[default: 1 on PostgreSQL, 0.05 on SQLite, which has no notifications].",
)
@click.option(
    "--name",
    envvar="SASFLOW_SCHEDULER_NAME",
    show_envvar=True,
    help="This scheduler's stable name in the cluster (the offline list is keyed by it) "
    "[default: host:pid].",
)
@click.option(
    "--address",
    envvar="SASFLOW_SCHEDULER_ADDRESS",
    show_envvar=True,
    help="Where operators reach it, shown by `schedulers list` [default: the host name].",
)
@click.option(
    "--fault-tolerance",
    type=click.IntRange(1, 1000),
    default=ClusterOptions.fault_tolerance,
    show_default=True,
    envvar="SASFLOW_SCHEDULER_FAULT_TOLERANCE",
    show_envvar=True,
    help="n: it holds at most N = 1 + K // max(S - n, 1) of the K schedules (S live schedulers).",
)
@click.option(
    "--alarm-threshold",
    type=click.IntRange(0),
    default=None,
    envvar="SASFLOW_SCHEDULER_ALARM_THRESHOLD",
    show_envvar=True,
    help="M: raise a scheduler_overloaded alert while it holds more schedules "
    "[default: unlimited].",
)
@click.option(
    "--lease-ttl",
    type=click.FloatRange(0.5, 3600),
    default=ClusterOptions.lease_ttl,
    show_default=True,
    envvar="SASFLOW_SCHEDULER_LEASE_TTL",
    show_envvar=True,
    help="Seconds its registration lives without renewal (renewed every third of it).",
)
@click.option(
    "--builder-timeout",
    type=click.FloatRange(0.01, 3600),
    default=UserCodeOptions.budget_s,
    show_default=True,
    envvar="SASFLOW_SCHEDULER_BUILDER_TIMEOUT",
    show_envvar=True,
    help="Seconds one call of a workflow's input builder or output builder may take (run off "
    "the loop); past them its step, or run, fails with the reason.",
)
@click.option(
    "--builder-threads",
    type=click.IntRange(1, 256),
    default=UserCodeOptions.threads,
    show_default=True,
    envvar="SASFLOW_SCHEDULER_BUILDER_THREADS",
    show_envvar=True,
    help="Threads that run input builders and output builders.",
)
@click.option(
    "--version-missing-after",
    type=click.FloatRange(0.1, 86400),
    default=AdvanceOptions.missing_after_s,
    show_default=True,
    envvar="SASFLOW_SCHEDULER_VERSION_MISSING_AFTER",
    show_envvar=True,
    help="Seconds runs may wait for a workflow version that no live scheduler has loaded "
    "before a version_missing alert is raised.",
)
@click.option(
    "--assignment",
    type=click.Choice(ASSIGNMENTS),
    default=ClusterOptions.assignment,
    show_default=True,
    envvar="SASFLOW_SCHEDULER_ASSIGNMENT",
    show_envvar=True,
    help="How schedules are distributed over the schedulers.",
)
@click.pass_obj
def scheduler(
    obj: CliContext,
    batch: int,
    reply_prefetch: int,
    max_in_flight: int,
    fleet_bound: bool,
    fleet_bound_factor: float | None,
    rescan_interval: float | None,
    name: str | None,
    address: str | None,
    fault_tolerance: int,
    alarm_threshold: int | None,
    lease_ttl: float,
    builder_timeout: float,
    builder_threads: int,
    version_missing_after: float,
    assignment: str,
) -> None:
    """Claim ready steps, dispatch them to agents and apply their replies; hold and fire
    recurring schedules (docs/cluster.md)."""
    engine: Engine | None = None
    try:
        options = SchedulerOptions(
            claim_batch=batch,
            reply_prefetch=reply_prefetch,
            max_in_flight=max_in_flight or None,
            fleet_bound=fleet_bound,
            fleet_bound_factor=fleet_bound_factor,
            rescan_interval=rescan_interval,
            pool_limits=PoolLimits(
                give_up_s=obj.settings.pool_give_up_s, max_looks=obj.settings.pool_max_looks
            ),
            limits=obj.settings.limits(),
            cluster=ClusterOptions(
                name=name,
                address=address,
                fault_tolerance=fault_tolerance,
                alarm_threshold=alarm_threshold,
                lease_ttl=lease_ttl,
                assignment=assignment,
            ),
            advance=AdvanceOptions(
                user_code=UserCodeOptions(threads=builder_threads, budget_s=builder_timeout),
                missing_after_s=version_missing_after,
            ),
        )
        # Refuses memory:// (and a broker list that cannot work) before any connection.
        transport = obj.transport("scheduler", long_running=True)
        engine = obj.engine("scheduler")
        check_not_refused(engine)
        role = Scheduler(
            engine,
            transport,
            obj.registry(),
            obj.names,
            database_url=obj.settings.database_url,
            options=options,
            stop=stop_event(),
            hooks=obj.hooks("scheduler"),
        )
        role.run()
    except SasflowError as exc:
        raise role_failed(exc) from exc
    finally:
        if engine is not None:
            engine.dispose()


def exit_despite_hung_handlers(status: int = 0) -> None:
    """Handlers abandoned at their deadline may still hold worker threads, which Python would
    wait for at exit: everything owed was replied or acked already, so leave now, with
    `status` (WEDGED_EXIT_CODE: wedged too long, restart me)."""
    hung = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if hung:
        logging.getLogger(__name__).warning(
            "exiting with %d handler threads still running", len(hung)
        )
        logging.shutdown()
        os._exit(status)
    if status:
        raise SystemExit(status)


BUILTIN_AGENTS = {"command": "sasflow.agents.command:agent"}
"""Agents that ship with sasflow: `sasflow agent --builtin NAME` needs no --app."""

DEFAULT_DRAIN_TIMEOUT = 25.0
"""Below Kubernetes' and systemd's usual 30 s between SIGTERM and SIGKILL."""


@click.command()
@click.argument("name", required=False)
@click.option(
    "--builtin",
    type=click.Choice(sorted(BUILTIN_AGENTS)),
    help="Serve an agent that ships with sasflow instead of NAME (no --app needed).",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 1000),
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    envvar="SASFLOW_AGENT_CONCURRENCY",
    show_envvar=True,
    help="Worker threads, and requests taken from the queue at once.",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(0, 86400),
    default=DEFAULT_DRAIN_TIMEOUT,
    show_default=True,
    envvar="SASFLOW_AGENT_DRAIN_TIMEOUT",
    show_envvar=True,
    help="Seconds a stopping agent (SIGTERM) waits for running steps before it kills their "
    "programs and leaves their requests to the broker.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="SASFLOW_AGENT_STATE_DIR",
    show_envvar=True,
    help="Directory of the pid files of running programs, to kill those a dead predecessor "
    "left [default: $XDG_STATE_HOME/sasflow/NAMESPACE/AGENT].",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(0.1, 3600),
    default=AgentOptions.heartbeat_interval,
    show_default=True,
    envvar="SASFLOW_AGENT_HEARTBEAT_INTERVAL",
    show_envvar=True,
    help="Seconds between fleet heartbeats (3 missed: the instance is lost).",
)
@click.option(
    "--wedge-grace",
    type=click.FloatRange(0, 86400),
    default=WedgeOptions.grace,
    show_default=True,
    envvar="SASFLOW_AGENT_WEDGE_GRACE",
    show_envvar=True,
    help="Seconds a handler may run on past its step's deadline before its thread counts as "
    "held; with every thread held the agent is wedged and takes no requests.",
)
@click.option(
    "--wedged-exit",
    type=click.FloatRange(0, 86400),
    default=WedgeOptions.exit_after,
    show_default=True,
    envvar="SASFLOW_AGENT_WEDGED_EXIT",
    show_envvar=True,
    help=f"Seconds wedged before the agent exits with status {WEDGED_EXIT_CODE} for its "
    "service manager to restart it (0: never).",
)
@click.option(
    "--pool",
    default=None,
    envvar="SASFLOW_AGENT_POOL",
    show_envvar=True,
    help="Serve only the steps that ask for this pool (its own queue) instead of the "
    "agent's shared queue.",
)
@click.pass_obj
def agent(
    obj: CliContext,
    name: str | None,
    builtin: str | None,
    concurrency: int,
    drain_timeout: float,
    state_dir: Path | None,
    heartbeat_interval: float,
    wedge_grace: float,
    wedged_exit: float,
    pool: str | None,
) -> None:
    """Serve agent NAME (from --app's registry) or MODULE:ATTRIBUTE (an Agent object), or a
    built-in agent (--builtin command)."""
    if (name is None) == (builtin is None):
        raise click.UsageError("give an agent NAME or --builtin, not both or neither")
    try:
        spec = BUILTIN_AGENTS[builtin] if builtin is not None else name or ""
        target = load_object(spec) if ":" in spec else obj.registry().agent(spec)
        if not isinstance(target, Agent):
            raise click.UsageError(f"{spec} is not a sasflow.agents.Agent with handlers")
        children = ChildProcesses(state_dir or default_state_dir(obj.names.namespace, target.name))
        hooks = obj.hooks("agent")
        role = AgentWorker(
            target,
            obj.transport(f"agent-{target.name}", long_running=True),
            obj.names,
            concurrency=concurrency,
            limits=obj.settings.limits(),
            stop=stop_event(),
            options=AgentOptions(
                heartbeat_interval=heartbeat_interval,
                drain_timeout=drain_timeout,
                children=children,
                consumer_timeout=obj.settings.broker_consumer_timeout or None,
                wedge=WedgeOptions(grace=wedge_grace, exit_after=wedged_exit),
            ),
            pool=pool,
            hooks=hooks,
        )
        role.run()
    except SasflowError as exc:
        raise role_failed(exc) from exc
    hooks.close()  # before a possible os._exit: flush the spans
    exit_despite_hung_handlers(role.exit_code)
