"""`sasflow supervisor`: the daemon, or one bounded sweep for cron / systemd timers / CronJobs."""

from __future__ import annotations

import contextlib
import time

import click

from sasflow.cli.context import CliContext, check_not_refused, role_failed, stop_event
from sasflow.errors import SasflowError, SchemaOutdatedError, StoreUnavailableError
from sasflow.ops.retention import GrowthRetention, RetentionPolicy
from sasflow.schema_watch import SchemaWatch
from sasflow.supervisor.dispatch import AlertDispatcher
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.supervisor.sinks import build_sinks

EXIT_RAN = 0
EXIT_COULD_NOT_RUN = 1


@click.command()
@click.option(
    "--once",
    is_flag=True,
    help="Run one sweep, print a summary line and exit (for cron and timers).",
)
@click.option(
    "--interval",
    type=click.FloatRange(0.1, 3600),
    default=SupervisorOptions.interval,
    show_default=True,
    envvar="SASFLOW_SUPERVISOR_INTERVAL",
    show_envvar=True,
    help="Seconds between sweeps of the daemon.",
)
@click.option(
    "--budget",
    type=click.FloatRange(0.1, 3600),
    default=SupervisorOptions.budget,
    show_default=True,
    envvar="SASFLOW_SUPERVISOR_BUDGET",
    show_envvar=True,
    help="Seconds one sweep (and with --once, alert delivery) may take.",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 100_000),
    default=SupervisorOptions.batch,
    show_default=True,
    envvar="SASFLOW_SUPERVISOR_BATCH",
    show_envvar=True,
    help="Expired steps counted per transaction.",
)
@click.option(
    "--stalled-after",
    type=click.FloatRange(1, 86400 * 7),
    default=SupervisorOptions.stalled_after,
    show_default=True,
    envvar="SASFLOW_SUPERVISOR_STALLED_AFTER",
    show_envvar=True,
    help="Seconds a ready step may wait unclaimed before a 'stalled' alert.",
)
@click.option(
    "--outage-after",
    type=click.FloatRange(0, 86400),
    default=SupervisorOptions.outage_after,
    show_default=True,
    envvar="SASFLOW_SUPERVISOR_OUTAGE_AFTER",
    show_envvar=True,
    help="Seconds an agent may have work waiting and no consumer (or, the broker away, no "
    "live instance) before one 'agent_outage' alert; and steps of an action no live "
    "instance has may be deferred before one 'action_missing' alert.",
)
@click.option(
    "--lease-ttl",
    type=click.FloatRange(1, 3600),
    default=None,
    envvar="SASFLOW_SUPERVISOR_LEASE_TTL",
    show_envvar=True,
    help="Seconds the leader's lease lasts unrenewed [default: max(3 x interval, 15)].",
)
@click.option(
    "--prune-interval",
    type=click.FloatRange(1, 86400),
    default=SupervisorOptions.prune_interval,
    show_default=True,
    envvar="SASFLOW_SUPERVISOR_PRUNE_INTERVAL",
    show_envvar=True,
    help="Seconds between two retention passes (runs, audit records, away stream "
    "subscribers, dead letters: SASFLOW_RETAIN_*, SASFLOW_API_STREAM_*_S).",
)
@click.option(
    "--prune-batch",
    type=click.IntRange(1, 10_000),
    default=SupervisorOptions.prune_batch,
    show_default=True,
    envvar="SASFLOW_SUPERVISOR_PRUNE_BATCH",
    show_envvar=True,
    help="Finished runs deleted per transaction.",
)
@click.option(
    "--prune-budget",
    type=click.FloatRange(0.1, 3600),
    default=SupervisorOptions.prune_budget,
    show_default=True,
    envvar="SASFLOW_SUPERVISOR_PRUNE_BUDGET",
    show_envvar=True,
    help="Seconds each part of a retention pass may take.",
)
@click.pass_obj
def supervisor(
    obj: CliContext,
    once: bool,
    interval: float,
    budget: float,
    batch: int,
    stalled_after: float,
    outage_after: float,
    lease_ttl: float | None,
    prune_interval: float,
    prune_batch: int,
    prune_budget: float,
) -> None:
    """Recover expired steps, escalate failures, deliver alerts and prune old history.

    Any number of supervisors may run (cron overlap, several hosts): one holds the lease and
    acts. With --once the exit status is 0 when the sweep ran or another supervisor holds the
    lease, 1 when it could not run (database unreachable), 2 on a usage error, 78 when the
    database or broker refused it or the database's schema is not at head.
    """
    options = SupervisorOptions(
        interval=interval,
        batch=batch,
        budget=budget,
        stalled_after=stalled_after,
        outage_after=outage_after,
        lease_ttl=lease_ttl,
        retention=RetentionPolicy.from_settings(obj.settings),
        growth=GrowthRetention.from_settings(obj.settings),
        prune_interval=prune_interval,
        prune_batch=prune_batch,
        prune_budget=prune_budget,
    )
    try:
        # Refuses memory:// (and a broker list that cannot work) before any connection.
        probe = obj.transport("supervisor", long_running=True)
    except SasflowError as exc:
        raise role_failed(exc) from exc
    engine = obj.engine("supervisor")
    role: Supervisor | None = None
    try:
        # Its loop retries whatever the database says: a refusal at start must end it here.
        check_not_refused(engine, probe)
        hooks = obj.hooks("supervisor", engine=engine)
        schema = SchemaWatch(engine, "supervisor")  # its sweeps and its alert thread share it
        dispatcher = AlertDispatcher(
            engine,
            build_sinks(obj.settings, lambda: obj.transport("alerts", long_running=True)),
            namespace=obj.settings.namespace,
            hooks=hooks,
            schema=schema,
            remind_every=obj.settings.alert_remind_s,
        )
        role = Supervisor(
            engine,
            obj.names,
            transport=obj.transport("supervisor", long_running=True),
            dispatcher=dispatcher,
            options=options,
            stop=None if once else stop_event(),
            hooks=hooks,
            schema=schema,
        )
        if not once:
            role.run()
            return
        started = time.monotonic()
        try:
            report = role.sweep_once()
        except SchemaOutdatedError:
            raise  # exit status 78, below
        except StoreUnavailableError as exc:
            click.echo(f"sasflow supervisor: could not run: {exc}", err=True)
            raise SystemExit(EXIT_COULD_NOT_RUN) from exc
        if report is None:
            click.echo("skipped: another supervisor holds the lease")
            return
        delivered = dispatcher.dispatch_pending(max(0.5, budget - (time.monotonic() - started)))
        role.lease.release(engine)
        click.echo(f"swept: {report.summary()} delivered={delivered}")
    except SasflowError as exc:
        raise role_failed(exc) from exc
    finally:
        if once and role is not None:
            dispatcher.stop()
            role.close()
            with contextlib.suppress(SasflowError):  # on failure paths too: never block cron
                role.lease.release(engine)
        engine.dispose()
