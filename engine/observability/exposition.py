"""How a process exposes its metrics: its registry (without `_created` series), what it runs
(`sasflow_build_info`) and the HTTP server that serves them on `/metrics`."""

from __future__ import annotations

import platform
from collections.abc import Iterable
from importlib import metadata

from prometheus_client import CollectorRegistry, Info, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import RestrictedRegistry

from sasflow.hooks import Hooks

CREATED_TYPES = frozenset({"counter", "histogram", "summary"})
"""The metric types for which prometheus-client adds a `<name>_created` series."""


def _without_created(family: Metric) -> Metric:
    """`family` less its `_created` sample(s): the time a series was first used, which
    Prometheus does not read and which doubles every counter's and histogram's series."""
    if family.type not in CREATED_TYPES:
        return family
    created = f"{family.name}_created"
    kept = [sample for sample in family.samples if sample.name != created]
    if len(kept) == len(family.samples):
        return family
    copy = Metric(family.name, family.documentation, family.type, family.unit)
    copy.samples = kept
    return copy


class _RestrictedWithoutCreated(RestrictedRegistry):
    """A scrape's `?name[]=` selection of a `Registry`, also without `_created` series."""

    def collect(self) -> Iterable[Metric]:
        return map(_without_created, super().collect())


class Registry(CollectorRegistry):
    """A process's registry, exposed without the `_created` series.

    prometheus-client switches those off only for the whole interpreter
    (`disable_created_metrics()` or `PROMETHEUS_DISABLE_CREATED_SERIES` read at import): global
    state that would also change the metrics of an application embedding sasflow. Leaving them
    out of what this registry collects changes sasflow's exposition and nothing else."""

    def collect(self) -> Iterable[Metric]:
        return map(_without_created, super().collect())

    def restricted_registry(self, names: Iterable[str]) -> RestrictedRegistry:
        return _RestrictedWithoutCreated(names, self)


def new_registry() -> CollectorRegistry:
    """A registry for one process: sasflow's metrics plus the standard `process_*` ones,
    without `_created` series (see `Registry`)."""
    registry = Registry()
    ProcessCollector(registry=registry)
    return registry


def sasflow_version() -> str:
    """The installed sasflow's version (`unknown` when it runs from a tree not installed)."""
    try:
        return metadata.version("sasflow")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_info(registry: CollectorRegistry, role: str, schema: str | None = None) -> Info:
    """`sasflow_build_info{role,version,python,schema} 1`: what this process runs, to join
    with other series (`* on (instance) group_left(version) sasflow_build_info`). `schema` is
    the migration head the code expects (`sasflow db check` compares the database with it);
    agents have no database and leave it out."""
    info = Info(
        "sasflow_build",
        "The sasflow build this process runs: its role, sasflow's and Python's versions and "
        "the database schema (migration head) its code expects.",
        registry=registry,
    )
    labels = {"role": role, "version": sasflow_version(), "python": platform.python_version()}
    if schema is not None:
        labels["schema"] = schema
    info.info(labels)
    return info


class MetricsServer(Hooks):
    """Serves a registry on `/metrics` (any path answers) until `close()`."""

    def __init__(self, registry: CollectorRegistry, port: int, address: str) -> None:
        self._server, self._thread = start_http_server(port, address, registry=registry)

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
