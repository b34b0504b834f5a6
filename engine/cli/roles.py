"""`sasflow submitter | scheduler | agent`: the long-running processes."""

from __future__ import annotations

import logging
import os
import threading

import click

from sasflow.agents.agent import Agent
from sasflow.agents.worker import DEFAULT_CONCURRENCY, AgentWorker
from sasflow.appload import load_object
from sasflow.cli.context import CliContext, check_not_refused, role_failed, stop_event
from sasflow.errors import SasflowError
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.store.db import Engine
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
@click.pass_obj
def submitter(obj: CliContext, prefetch: int) -> None:
    """Consume <ns>.submit and record each submission as a run (idempotent on its key)."""
    engine: Engine | None = None
    try:
        transport = obj.transport("submitter")  # refuses memory:// before any connection
        engine = obj.engine("submitter")
        check_not_refused(engine)  # it touches the database only when a submission arrives
        role = Submitter(
            engine,
            transport,
            obj.registry(),
            obj.names,
            prefetch=prefetch,
            limits=obj.settings.limits(),
            stop=stop_event(),
            hooks=obj.hooks("submitter"),
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
    "--rescan-interval",
    type=click.FloatRange(0.05, 60),
    default=None,
    envvar="SASFLOW_SCHEDULER_RESCAN_INTERVAL",
    show_envvar=True,
    help="Seconds between claims when no notification woke us "
    "[default: 1 on PostgreSQL, 0.05 on SQLite, which has no notifications].",
)
@click.pass_obj
def scheduler(
    obj: CliContext, batch: int, reply_prefetch: int, rescan_interval: float | None
) -> None:
    """Claim ready steps, dispatch them to agents and apply their replies."""
    engine: Engine | None = None
    try:
        options = SchedulerOptions(
            claim_batch=batch,
            reply_prefetch=reply_prefetch,
            rescan_interval=rescan_interval,
            limits=obj.settings.limits(),
        )
        transport = obj.transport("scheduler")  # refuses memory:// before any connection
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


def exit_despite_hung_handlers() -> None:
    """Handlers abandoned at their deadline may still hold worker threads, which Python would
    wait for at exit: everything owed was replied or acked already, so leave now."""
    hung = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if hung:
        logging.getLogger(__name__).warning(
            "exiting with %d handler threads still running", len(hung)
        )
        logging.shutdown()
        os._exit(0)


@click.command()
@click.argument("name")
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
@click.pass_obj
def agent(obj: CliContext, name: str, concurrency: int) -> None:
    """Serve agent NAME (from --app's registry) or MODULE:ATTRIBUTE (an Agent object)."""
    try:
        target = load_object(name) if ":" in name else obj.registry().agent(name)
        if not isinstance(target, Agent):
            raise click.UsageError(f"{name} is not a sasflow.agents.Agent with handlers")
        hooks = obj.hooks("agent")
        role = AgentWorker(
            target,
            obj.transport(f"agent-{target.name}"),
            obj.names,
            concurrency=concurrency,
            limits=obj.settings.limits(),
            stop=stop_event(),
            hooks=hooks,
        )
        role.run()
    except SasflowError as exc:
        raise role_failed(exc) from exc
    hooks.close()  # before a possible os._exit: flush the spans
    exit_despite_hung_handlers()
