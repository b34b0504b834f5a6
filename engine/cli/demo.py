"""`sasflow demo`: the pattern's e-commerce example, every role in this one process."""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from sasflow.cli.context import CliContext, fail, stop_event
from sasflow.demo.display import make_display
from sasflow.demo.run import Demo, DemoOptions, DemoResult
from sasflow.demo.scenario import DEFAULT_ORDERS, DEFAULT_SEED, MIN_ORDERS
from sasflow.errors import SasflowError
from sasflow.local import RoleCrashedError
from sasflow.redact import redact_url
from sasflow.store.db import make_engine
from sasflow.transport.base import Transport
from sasflow.transport.factory import broker_options, is_in_process, make_transport
from sasflow.transport.memory import MemoryBroker
from sasflow.transport.topology import Names

DEMO_NAMESPACE = "sasflow-demo"
"""Used unless --namespace is given, so the demo never feeds a real deployment's queues."""
DEMO_DATABASE = "sasflow-demo.db"
"""The SQLite file in the working directory used (and recreated) unless a database is given."""
DEMO_BROKER_URL = "memory://"
"""The in-process bus, unless a broker is given."""


def _given(ctx: click.Context, name: str) -> bool:
    """Whether the global option `name` came from the command line or the environment."""
    root = ctx.find_root()
    return root.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)


def _fresh_sqlite(path: Path) -> str:
    """Remove the demo's previous SQLite file (with its WAL files) and return the new URL."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    return f"sqlite:///{path}"


def _summary_table(result: DemoResult) -> Table:
    summary = result.summary
    table = Table()
    table.add_column("what")
    table.add_column("count", justify="right")
    for state, count in summary.runs_by_state.items():
        table.add_row(f"runs {state}", str(count))
    table.add_row("steps retried (attempt > 1)", str(summary.steps_retried))
    table.add_row("failures counted", str(summary.failures_counted))
    table.add_row("deferrals by an open breaker", str(summary.deferred))
    table.add_row("expired steps recovered", str(summary.expired_recovered))
    table.add_row("compensating steps run", str(summary.compensations_processed))
    table.add_row("alerts raised", str(summary.alerts_raised))
    table.add_row("payment confirmations matched", str(summary.events_matched))
    table.add_row("  stored before their wait opened", str(summary.events_before_wait))
    table.add_row("payment waits timed out", str(summary.event_timeouts))
    table.add_row("cool-off timers fired", str(summary.timers_fired))
    for kind, count in result.agent_counts.items():
        table.add_row(f"agent side: {kind}", str(count))
    return table


def _inspect_commands(database_url: str, result: DemoResult) -> list[str]:
    base = f"sasflow --database-url {shlex.quote(redact_url(database_url))} runs show"
    return [
        f"{base} {run_id}"
        for run_id in [*result.summary.error_runs, *result.summary.compensated_runs]
    ]


def _document(result: DemoResult, database_url: str, namespace: str) -> dict[str, Any]:
    return {
        **result.summary.as_dict(),
        "seconds": round(result.seconds, 2),
        "agent_counts": result.agent_counts,
        "problems": result.problems,
        "key_prefix": result.key_prefix,
        "database_url": redact_url(database_url),
        "namespace": namespace,
        "inspect": _inspect_commands(database_url, result),
    }


@click.command()
@click.option(
    "--orders",
    type=click.IntRange(MIN_ORDERS, 100_000),
    default=DEFAULT_ORDERS,
    show_default=True,
    help="Orders to place.",
)
@click.option(
    "--seed",
    type=int,
    default=DEFAULT_SEED,
    show_default=True,
    help="Seed of the simulated trouble (which order fails how, latencies).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(1, 3600),
    default=120.0,
    show_default=True,
    help="Seconds to wait for every order to finish.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print only the machine-readable summary (JSON) on stdout.",
)
@click.option(
    "--summary-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the machine-readable summary (JSON) to this file.",
)
@click.pass_context
def demo(
    ctx: click.Context,
    orders: int,
    seed: int,
    timeout: float,
    as_json: bool,
    summary_file: Path | None,
) -> None:
    """Run the e-commerce example: orders reserve stock, charge, wait for the payment
    provider's confirmation (an event), cool off (a timer) and ship, through simulated
    services that are slow, fail now and then, go down, and crash.

    Submitter, schedulers, agents, supervisor and the payment provider run as threads of this
    process. Retries, an open circuit breaker, a recovered expired step, a compensated order,
    an order in error with an alert, and a confirmation stored before its order's wait opened
    all happen; the summary is read from the state store.

    By default the state store is ./sasflow-demo.db (a SQLite file, recreated on each run, kept
    afterwards for `sasflow --database-url sqlite:///sasflow-demo.db runs ...`) and the bus is
    in-process. The global --database-url, --broker-url and --namespace options switch to real
    services (the namespace defaults to sasflow-demo). Exit status 0 when everything happened
    as designed.
    """
    obj: CliContext = ctx.obj
    settings = obj.settings
    broker_url = settings.broker_url if _given(ctx, "broker_url") else DEMO_BROKER_URL
    namespace = settings.namespace if _given(ctx, "namespace") else DEMO_NAMESPACE
    broker = MemoryBroker() if is_in_process(broker_url) else None
    if not _given(ctx, "log_level"):
        # The live view tells the story; the roles' own logs would interleave with it.
        logging.getLogger().setLevel(logging.ERROR)
        logging.getLogger("pika").setLevel(logging.CRITICAL)  # its errors end in ours below
    console = Console(stderr=as_json)

    def transports(role: str) -> Transport:
        return make_transport(
            broker_url,
            process_name=f"sasflow-demo-{role}",
            broker=broker,
            options=broker_options(settings),
        )

    try:
        database_url = (
            settings.database_url
            if _given(ctx, "database_url")
            else _fresh_sqlite(Path(DEMO_DATABASE))
        )
        engine = make_engine(database_url, application_name="sasflow-demo", pool_size=8)
    except SasflowError as exc:
        raise fail(exc) from exc
    stop = stop_event()
    display = make_display(console, orders, quiet=as_json)
    try:
        result = Demo(
            engine,
            transports,
            Names(namespace),
            database_url=database_url,
            options=DemoOptions(orders=orders, seed=seed, timeout=timeout),
        ).run(display.update, stop)
    except RoleCrashedError as exc:
        raise click.ClickException(f"the demo failed: {exc}") from exc
    except SasflowError as exc:
        raise fail(exc) from exc
    finally:
        display.close()
        engine.dispose()
    document = _document(result, database_url, namespace)
    if summary_file is not None:
        summary_file.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        console.print("sasflow demo: summary, read from the state store", style="bold")
        console.print(_summary_table(result))
        recorded = "" if result.summary.orders == orders else f" ({result.summary.orders} recorded)"
        console.print(
            f"{orders} orders{recorded} in {result.seconds:.1f}s (namespace {namespace}).",
            highlight=False,
        )
        for command in document["inspect"]:
            console.print(
                f"Inspect a failed order: {command}", markup=False, highlight=False, soft_wrap=True
            )
    if result.problems:
        raise click.ClickException(
            "the demo did not run as designed: " + "; ".join(result.problems)
        )
