"""Build a role's hooks from the settings: metrics, tracing and log context, as configured."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sasflow.errors import ConfigurationError
from sasflow.hooks import HookChain, Hooks
from sasflow.settings import Settings
from sasflow.transport.topology import Names

if TYPE_CHECKING:
    from collections.abc import Callable

    from prometheus_client.registry import Collector

    from sasflow.observability.exposition import MetricsServer
    from sasflow.observability.metrics import ApiMetrics
    from sasflow.store.db import Engine
    from sasflow.store.operator.gauges import StateCounts

log = logging.getLogger(__name__)

SCHEDULER_ALIVE_WITHIN = 30.0
"""Seconds since a scheduler's last heartbeat (every 5 s) within which it counts as alive."""


def role_hooks(settings: Settings, role: str, *, engine: Engine | None = None) -> HookChain:
    """The hooks of `role` (scheduler, submitter, agent, supervisor). The supervisor's
    `engine` feeds its gauges of work by state. Close the chain when the role stops."""
    hooks: list[Hooks] = []
    try:
        if settings.metrics_port is not None:
            hooks.extend(_metrics(settings, role, engine))
        if settings.trace_file:
            hooks.append(_tracing(settings, role, settings.trace_file))
    except BaseException:
        HookChain(hooks).close()
        raise
    if settings.log_format == "json":
        from sasflow.observability.jsonlog import LogContext  # noqa: PLC0415

        hooks.append(LogContext())
    return HookChain(hooks)


def _metrics(settings: Settings, role: str, engine: Engine | None) -> list[Hooks]:
    try:
        from sasflow.observability import exposition, metrics  # noqa: PLC0415 - only when asked
    except ImportError as exc:
        raise ConfigurationError(
            f"--metrics-port needs prometheus-client: pip install 'sasflow[metrics]' ({exc})"
        ) from exc
    collectors: list[Collector] = []
    if role == "supervisor" and engine is not None:
        collectors.append(metrics.StateGauges(_state_reader(engine)))
        collectors.append(metrics.LimitGauges(_held_reader(engine)))
    port = settings.metrics_port or 0
    schema = None if role == "agent" else _schema_head()  # agents have no database
    try:
        made = metrics.role_metrics(role, port, settings.metrics_address, collectors, schema=schema)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {settings.metrics_address}:{port}: {exc}"
        ) from exc
    server = made[-1]
    if isinstance(server, exposition.MetricsServer):
        log.info("serving metrics on http://%s:%d/metrics", settings.metrics_address, server.port)
    return made


def api_metrics(settings: Settings) -> tuple[ApiMetrics, MetricsServer]:
    """The HTTP API's metrics and the server that exposes them on `settings.metrics_port`
    (close it at exit)."""
    try:
        from sasflow.observability import exposition, metrics  # noqa: PLC0415 - only when asked
    except ImportError as exc:
        raise ConfigurationError(
            f"--metrics-port needs prometheus-client: pip install 'sasflow[metrics]' ({exc})"
        ) from exc
    port = settings.metrics_port or 0
    observed = metrics.ApiMetrics(schema=_schema_head())
    try:
        server = exposition.MetricsServer(observed.registry, port, settings.metrics_address)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {settings.metrics_address}:{port}: {exc}"
        ) from exc
    log.info("serving metrics on http://%s:%d/metrics", settings.metrics_address, server.port)
    return observed, server


def _schema_head() -> str | None:
    """The migration head this code expects (what `sasflow_build_info` shows as `schema`)."""
    from sasflow.store.migrate import head  # noqa: PLC0415 - roles with a database only

    return head()


def _state_reader(engine: Engine) -> Callable[[], StateCounts]:
    from sasflow.store.cluster.lease import SUPERVISOR_LEASE  # noqa: PLC0415
    from sasflow.store.db import transaction  # noqa: PLC0415
    from sasflow.store.operator import gauges  # noqa: PLC0415

    def read() -> StateCounts:
        with transaction(engine) as conn:
            return gauges.state_counts(
                conn, lease=SUPERVISOR_LEASE, alive_within=SCHEDULER_ALIVE_WITHIN
            )

    return read


def _held_reader(engine: Engine) -> Callable[[], dict[str, int]]:
    from sasflow.store.db import transaction  # noqa: PLC0415
    from sasflow.store.flow.state import held_counts  # noqa: PLC0415

    def read() -> dict[str, int]:
        with transaction(engine) as conn:
            return held_counts(conn)

    return read


def _tracing(settings: Settings, role: str, trace_file: str) -> Hooks:
    try:
        from sasflow.observability import tracing  # noqa: PLC0415 - only when asked for
    except ImportError as exc:
        raise ConfigurationError(
            f"tracing needs OpenTelemetry: pip install 'sasflow[otel]' ({exc})"
        ) from exc
    provider = tracing.file_provider(f"sasflow-{role}", trace_file)
    return tracing.Tracing(provider, Names(settings.namespace))
