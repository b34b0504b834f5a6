"""`sasflow run`: every role of the app in one process (for development and the tutorial)."""

from __future__ import annotations

import click

from sasflow.backpressure import SubmitterBackpressure
from sasflow.cli.context import CliContext, check_schema, fail, stop_event
from sasflow.cli.roles import exit_despite_hung_handlers
from sasflow.errors import SasflowError
from sasflow.local import LocalOptions, LocalRunner, add_roles, prepare_store
from sasflow.scheduler import SchedulerOptions
from sasflow.supervisor.service import SupervisorOptions
from sasflow.supervisor.sinks import build_sinks
from sasflow.transport.base import Transport


@click.command("run")
@click.option(
    "--schedulers",
    type=click.IntRange(1, 64),
    default=LocalOptions.schedulers,
    show_default=True,
    help="Scheduler threads.",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 1000),
    default=LocalOptions.agent_concurrency,
    show_default=True,
    help="Worker threads of each agent.",
)
@click.option(
    "--supervisor-interval",
    type=click.FloatRange(0.1, 3600),
    default=SupervisorOptions.interval,
    show_default=True,
    help="Seconds between the supervisor's sweeps.",
)
@click.option(
    "--migrate/--no-migrate",
    default=True,
    show_default=True,
    help="Create or migrate the state store's schema first.",
)
@click.pass_obj
def run_command(
    obj: CliContext, schedulers: int, concurrency: int, supervisor_interval: float, migrate: bool
) -> None:
    """Run the submitter, schedulers, every agent of --app and a supervisor as threads of
    this one process, until SIGINT or SIGTERM (exit 1 if a role crashes).

    The same roles as the separate commands, sharing one database pool; agents that the
    registry declares as external are not served. For production run the roles as separate
    processes, which scale and fail independently.
    """
    stop = stop_event()
    obj.in_process = True  # every role is a thread here: memory:// may connect them
    try:
        registry = obj.registry()
        engine = obj.engine("run", pool_size=schedulers + 4)
        if migrate:
            prepare_store(engine)
        else:
            check_schema(engine)

        def transports(role: str) -> Transport:
            return obj.transport(role, long_running=True)

        runner = LocalRunner()
        add_roles(
            runner,
            engine,
            transports,
            registry,
            obj.names,
            database_url=obj.settings.database_url,
            options=LocalOptions(
                schedulers=schedulers,
                agent_concurrency=concurrency,
                scheduler=SchedulerOptions(),
                supervisor=SupervisorOptions(interval=supervisor_interval),
                limits=obj.settings.limits(),
                backpressure=SubmitterBackpressure(max_backlog=obj.settings.max_backlog),
            ),
            sinks=build_sinks(obj.settings, lambda: obj.transport("alerts", long_running=True)),
        )
        click.echo(f"sasflow run: {', '.join(runner.names)}", err=True)
        try:
            with runner.running():
                runner.wait(stop)
        finally:
            engine.dispose()
    except SasflowError as exc:
        raise fail(exc) from exc
    exit_despite_hung_handlers()
