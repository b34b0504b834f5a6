"""`sasflow api`: serve the HTTP API (FastAPI on uvicorn) and deliver its callbacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from sasflow.cli.context import (
    CliContext,
    ConfigurationExit,
    check_definitions,
    check_not_refused,
    engine_options,
    role_failed,
)
from sasflow.errors import ConfigurationError, SasflowError
from sasflow.hooks import NO_HOOKS
from sasflow.observability.build import api_metrics
from sasflow.settings import Settings
from sasflow.store.db import make_engine
from sasflow.transport.factory import broker_options, is_in_process, make_transport

POOL_SIZE = 10
"""Connections of the API server's pool (FastAPI runs sync handlers on 40 threads; a
request holds a connection for one short transaction)."""


@click.command("api")
@click.option(
    "--host", envvar="SASFLOW_API_HOST", show_envvar=True, help="Address [default: 127.0.0.1]."
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    envvar="SASFLOW_API_PORT",
    show_envvar=True,
    help="Port [default: 8080].",
)
@click.option(
    "--ssl-certfile",
    type=click.Path(exists=True, dir_okay=False),
    envvar="SASFLOW_API_SSL_CERTFILE",
    show_envvar=True,
    help="Serve HTTPS with this certificate (PEM).",
)
@click.option(
    "--ssl-keyfile",
    type=click.Path(exists=True, dir_okay=False),
    envvar="SASFLOW_API_SSL_KEYFILE",
    show_envvar=True,
    help="Private key of the certificate [default: in the certificate file].",
)
@click.option(
    "--callbacks/--no-callbacks",
    default=None,
    envvar="SASFLOW_API_CALLBACKS",
    show_envvar=True,
    help="Deliver due callbacks from this server [default: on; several servers share them].",
)
@click.pass_obj
def api_command(
    obj: CliContext,
    host: str | None,
    port: int | None,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
    callbacks: bool | None,
) -> None:
    """Serve the HTTP API: REST runs with callbacks, alerts, health (docs/api.md)."""
    try:
        from sasflow.api.app import create_app  # noqa: PLC0415 - the api extra, loaded here
        from sasflow.api.context import ApiContext  # noqa: PLC0415
        from sasflow.api.server import serve  # noqa: PLC0415
    except ImportError as exc:
        raise click.ClickException(
            f"sasflow api needs the api extra: pip install 'sasflow[api]' ({exc})"
        ) from exc
    settings = _with(
        obj.settings,
        api_host=host,
        api_port=port,
        api_ssl_certfile=ssl_certfile,
        api_ssl_keyfile=ssl_keyfile,
        api_callbacks=callbacks,
    )
    try:
        readiness = broker_check(settings)
    except ConfigurationError as exc:  # a broker list that cannot work: fix, do not restart
        raise ConfigurationExit(str(exc)) from exc
    engine = make_engine(settings.database_url, engine_options(settings, "api", POOL_SIZE))
    metrics_server = None
    try:
        observed = None
        if settings.metrics_port is not None:
            observed, metrics_server = api_metrics(settings)
        hooks = NO_HOOKS if observed is None else observed.doors
        registry = obj.registry()
        ctx = ApiContext(engine, registry, settings, readiness, hooks=hooks)
        check_not_refused(engine)
        check_definitions(engine, registry, actor="api")  # it submits runs
        app = create_app(ctx)
        if observed is not None:
            from sasflow.api.metrics import RequestMetrics  # noqa: PLC0415 - the metrics extra

            app.add_middleware(RequestMetrics, metrics=observed)
        serve(app, ctx)
    except SasflowError as exc:
        raise role_failed(exc) from exc
    finally:
        if metrics_server is not None:
            metrics_server.close()
        engine.dispose()


def broker_check(settings: Settings) -> Callable[[], None]:
    """What /readyz calls: connect to RabbitMQ and close again (the in-process bus has
    nothing to reach)."""
    if is_in_process(settings.broker_url):
        return lambda: None
    options = broker_options(settings)
    make_transport(settings.broker_url, process_name="sasflow-api", options=options)  # checks

    def check() -> None:
        transport = make_transport(settings.broker_url, process_name="sasflow-api", options=options)
        try:
            transport.connect()
        finally:
            transport.close()

    return check


def _with(settings: Settings, **overrides: Any) -> Settings:
    """`settings` with the options given on the command line (click checked their types)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return settings.model_copy(update=given) if given else settings
