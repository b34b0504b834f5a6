"""What a role's /metrics shows: no `_created` series (without touching prometheus-client's
process-wide switch), `sasflow_build_info`, runs finished by workflow, and a supervisor's
last-sweep time only while it leads."""

from __future__ import annotations

import platform
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from sasflow.commands import FinishedRun
from sasflow.hooks import HookChain
from sasflow.observability import exposition, metrics
from sasflow.states import RunState
from sasflow.store.runs.sweeps import SweepReport

LAST_SWEEP = "sasflow_supervisor_last_sweep_timestamp_seconds"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def _scrape(port: int, query: str = "", accept: str | None = None) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics{query}")
    if accept is not None:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - http://127.0.0.1
        return str(response.read().decode())


def _sample_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.fixture
def scheduler_server() -> exposition.MetricsServer:
    made = metrics.role_metrics("scheduler", 0, "127.0.0.1", schema="0099")
    hooks, server = made[0], made[-1]
    assert isinstance(hooks, metrics.SchedulerMetrics)
    assert isinstance(server, exposition.MetricsServer)
    hooks.steps_dispatched(3, 0.01)  # a counter and a histogram with samples
    hooks.runs_finished(None, {1: FinishedRun(RunState.COMPLETED, "orders")})  # type: ignore[arg-type]
    return server


@pytest.mark.parametrize("accept", [None, OPENMETRICS], ids=["text", "openmetrics"])
def test_a_role_serves_no_created_series_in_either_format(
    scheduler_server: exposition.MetricsServer, accept: str | None
) -> None:
    try:
        text = _scrape(scheduler_server.port, accept=accept)
    finally:
        scheduler_server.close()
    lines = _sample_lines(text)
    assert [line for line in lines if "_created" in line] == []
    assert any(line.startswith("sasflow_steps_dispatched_total 3") for line in lines)
    assert any(line.startswith("sasflow_dispatch_duration_seconds_count 1") for line in lines)


def test_a_scrape_that_selects_names_gets_no_created_series_either(
    scheduler_server: exposition.MetricsServer,
) -> None:
    query = "?name[]=sasflow_steps_dispatched_total&name[]=sasflow_steps_dispatched_created"
    try:
        lines = _sample_lines(_scrape(scheduler_server.port, query))
    finally:
        scheduler_server.close()
    assert lines == ["sasflow_steps_dispatched_total 3.0"]


def test_prometheus_clients_own_switch_is_left_alone() -> None:
    """An application embedding sasflow keeps its own `_created` series: sasflow changes its
    registries, not the library's process-wide setting."""
    ours = exposition.new_registry()
    Counter("ours", "a counter", registry=ours).inc()
    theirs = CollectorRegistry()
    Counter("theirs", "a counter", registry=theirs).inc()
    assert b"ours_created" not in generate_latest(ours)
    assert b"theirs_created" in generate_latest(theirs)


def test_the_api_metrics_render_no_created_series() -> None:
    api = metrics.ApiMetrics(schema="0099")
    api.observe("get", "/v1/runs", 200, 0.01)
    body, _ = api.render()
    assert b"_created" not in body
    assert b'sasflow_http_requests_total{method="GET",route="/v1/runs",status="200"} 1.0' in body


def test_build_info_names_the_role_the_versions_and_the_schema() -> None:
    registry = exposition.new_registry()
    exposition.build_info(registry, "supervisor", "0013")
    agent = exposition.new_registry()
    exposition.build_info(agent, "agent")
    labels = {
        "role": "supervisor",
        "version": exposition.sasflow_version(),
        "python": platform.python_version(),
        "schema": "0013",
    }
    assert registry.get_sample_value("sasflow_build_info", labels) == 1
    assert exposition.sasflow_version() not in ("", "unknown")  # installed editable in the venv
    del labels["schema"]
    assert agent.get_sample_value("sasflow_build_info", {**labels, "role": "agent"}) == 1


def test_every_role_and_the_api_export_build_info(
    scheduler_server: exposition.MetricsServer,
) -> None:
    try:
        text = _scrape(scheduler_server.port)
    finally:
        scheduler_server.close()
    (line,) = [x for x in _sample_lines(text) if x.startswith("sasflow_build_info")]
    assert 'role="scheduler"' in line
    assert 'schema="0099"' in line
    assert line.endswith(" 1.0")
    assert b'sasflow_build_info{python="' in metrics.ApiMetrics().render()[0]


def test_runs_finished_are_counted_by_workflow_and_state() -> None:
    registry = exposition.new_registry()
    hooks = HookChain([metrics.SchedulerMetrics(registry)])
    hooks.runs_finished(
        None,  # type: ignore[arg-type]
        {
            1: FinishedRun(RunState.COMPLETED, "orders"),
            2: FinishedRun(RunState.COMPLETED, "orders"),
            3: FinishedRun(RunState.ERROR, "orders"),
            4: FinishedRun(RunState.COMPLETED, "refunds"),
        },
    )
    value = registry.get_sample_value
    name = "sasflow_runs_finished_total"
    assert value(name, {"workflow": "orders", "state": "completed"}) == 2
    assert value(name, {"workflow": "orders", "state": "error"}) == 1
    assert value(name, {"workflow": "refunds", "state": "completed"}) == 1
    assert value(name, {"workflow": "refunds", "state": "error"}) is None


def test_a_standby_supervisor_reports_no_last_sweep_time() -> None:
    """Standby from the start: no sample (not 0). Leader: the time of its last sweep. Back to
    standby (another took the lease): no sample again; `sasflow_supervisor_leader` says 0."""
    registry = exposition.new_registry()
    hooks = metrics.SupervisorMetrics(registry)
    value = registry.get_sample_value
    assert value(LAST_SWEEP) is None
    assert f"# TYPE {LAST_SWEEP} gauge" in generate_latest(registry).decode()

    hooks.sweep_finished(None)
    assert (value(LAST_SWEEP), value("sasflow_supervisor_leader")) == (None, 0)

    hooks.sweep_finished(SweepReport(seconds=0.01))
    swept = value(LAST_SWEEP)
    assert swept is not None
    assert swept > 1.7e9  # a Unix time, not a duration or a zero
    assert value("sasflow_supervisor_leader") == 1

    hooks.sweep_finished(None)
    assert (value(LAST_SWEEP), value("sasflow_supervisor_leader")) == (None, 0)
