"""`sasflow`: the command line of every sasflow process and of operators."""

from __future__ import annotations

import click

from sasflow.cli.context import CliContext, build_settings, setup_logging
from sasflow.cli.lazy import LazyGroup

COMMANDS = {
    "agent": "sasflow.cli.roles:agent",
    "agents": "sasflow.cli.agents:agents",
    "alerts": "sasflow.cli.alerts:alerts",
    "approvals": "sasflow.cli.approvals:approvals",
    "api": "sasflow.cli.api:api_command",
    "audit": "sasflow.cli.audit:audit",
    "config": "sasflow.cli.config:config",
    "db": "sasflow.cli.db:db",
    "dead": "sasflow.cli.dead:dead",
    "demo": "sasflow.cli.demo:demo",
    "events": "sasflow.cli.events:events",
    "limits": "sasflow.cli.limits:limits",
    "namespace": "sasflow.cli.namespace:namespace",
    "queues": "sasflow.cli.queues:queues",
    "run": "sasflow.cli.run:run_command",
    "runs": "sasflow.cli.runs:runs",
    "scheduler": "sasflow.cli.roles:scheduler",
    "schedulers": "sasflow.cli.registrations:schedulers",
    "schedules": "sasflow.cli.schedules:schedules",
    "submit": "sasflow.cli.submit:submit_command",
    "submitter": "sasflow.cli.roles:submitter",
    "supervisor": "sasflow.cli.supervisor:supervisor",
    "tokens": "sasflow.cli.tokens:tokens",
}
"""Each subcommand's module is imported only when it runs (see cli/lazy.py)."""

LONG_RUNNING = frozenset({"agent", "api", "demo", "run", "scheduler", "submitter", "supervisor"})
"""The roles and servers, whose logs are wanted; every other command is one-shot: no broker
log line on its stderr unless -v."""


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--database-url",
    envvar="SASFLOW_DATABASE_URL",
    show_envvar=True,
    help="State store URL: postgresql+psycopg://user@localhost/sasflow, or "
    "sqlite:///PATH [default: sqlite:///sasflow.db].",
)
@click.option(
    "--broker-url",
    envvar="SASFLOW_BROKER_URL",
    show_envvar=True,
    help="Broker URL: amqp://localhost:5672/%2F (RabbitMQ), several comma-separated for a "
    "cluster (tried in a random order), or memory:// (the in-process bus of demo and run) "
    "[default: memory://].",
)
@click.option(
    "--namespace",
    envvar="SASFLOW_NAMESPACE",
    show_envvar=True,
    help="Prefix of queue and exchange names [default: sasflow].",
)
@click.option(
    "--app",
    "app",
    envvar="SASFLOW_APP",
    show_envvar=True,
    help="Module (or module:attribute) with the workflow and agent registry.",
)
@click.option(
    "--log-level",
    envvar="SASFLOW_LOG_LEVEL",
    show_envvar=True,
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--log-format",
    envvar="SASFLOW_LOG_FORMAT",
    show_envvar=True,
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="json: one JSON object per line (docs/observability.md).",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    envvar="SASFLOW_VERBOSE",
    show_envvar=True,
    help="Also print the broker client's log lines from WARNING up (a one-shot command, "
    "e.g. `sasflow dead list`, prints none of them without it).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    envvar="SASFLOW_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus /metrics on this port (long-running roles) [default: off].",
)
@click.option(
    "--trace-file",
    envvar="SASFLOW_TRACE_FILE",
    show_envvar=True,
    help="Trace with OpenTelemetry, appending spans to this JSON-lines file [default: off].",
)
@click.version_option(package_name="sasflow")
@click.pass_context
def cli(
    ctx: click.Context,
    database_url: str | None,
    broker_url: str | None,
    namespace: str | None,
    app: str | None,
    log_level: str,
    log_format: str,
    verbose: bool,
    metrics_port: int | None,
    trace_file: str | None,
) -> None:
    """sasflow: workflows on the Scheduler-Agent-Supervisor pattern."""
    command = ctx.invoked_subcommand or "cli"
    setup_logging(
        log_level,
        log_format,
        command,
        one_shot=command not in LONG_RUNNING,
        verbose=verbose,
    )
    ctx.obj = CliContext(
        build_settings(
            database_url=database_url,
            broker_url=broker_url,
            namespace=namespace,
            app=app,
            log_format=log_format,
            metrics_port=metrics_port,
            trace_file=trace_file,
        )
    )


def main() -> None:
    cli(prog_name="sasflow")
