"""Observability with real processes: one run's spans form one connected trace across the
submitter, scheduler, agent and supervisor; each role serves its metrics; logs are JSON lines."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pika
import pytest
from sqlalchemy import Engine, select

from sasflow.store.schema import runs
from sasflow.transport.topology import Names
from tests import harness, services
from tests.acceptance.processes import Processes

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

EXTERNAL_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
EXTERNAL_SPAN = "00f067aa0ba902b7"
ROLES = {
    "agent": ("agent", "observed"),
    "scheduler": ("scheduler",),
    "submitter": ("submitter",),
    "supervisor": ("supervisor", "--interval", "0.2"),
}


def _start(procs: Processes, tmp_path: Path) -> None:
    for name, command in ROLES.items():
        procs.start(
            name,
            "--app",
            "tests.apps.observed",
            "--log-format",
            "json",
            "--metrics-port",
            "0",
            "--trace-file",
            str(tmp_path / f"{name}.spans.jsonl"),
            *command,
        )


def _log_lines(procs: Processes, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in procs.log(name).splitlines() if line.strip()]


def _metrics_port(procs: Processes, name: str) -> int | None:
    for line in _log_lines(procs, name):
        found = re.search(r"serving metrics on http://[^:]+:(\d+)/metrics", line["message"])
        if found:
            return int(found.group(1))
    return None


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def _submit(names: Names) -> None:
    with services.broker_channel() as channel:
        channel.confirm_delivery()
        channel.queue_declare(
            names.submit,
            durable=True,
            arguments={"x-dead-letter-exchange": names.dead_letter_exchange},
        )
        channel.basic_publish(
            "",
            names.submit,
            json.dumps({"workflow": "traced", "key": "t-1", "input": {"text": "hi"}}).encode(),
            pika.BasicProperties(
                delivery_mode=2,
                content_type="application/json",
                headers={"traceparent": f"00-{EXTERNAL_TRACE}-{EXTERNAL_SPAN}-01"},
            ),
        )


def _spans(tmp_path: Path) -> list[dict[str, Any]]:
    spans = []
    for name in ROLES:
        path = tmp_path / f"{name}.spans.jsonl"
        spans += [json.loads(line) for line in path.read_text().splitlines() if line]
    return spans


def test_one_run_is_one_trace_across_processes_with_metrics_and_json_logs(
    tmp_path: Path, engine: Engine, names: Names, procs: Processes
) -> None:
    """A run submitted with an external traceparent: every span of every role carries that
    trace id and hangs, through parent ids, from the external span, covering submit, claim,
    publish, the agent's handler (with its retry as an event and its breaker state), the reply,
    its apply, the supervisor's expiry and the run's completion. Each role's /metrics shows
    what it did; each log line is a JSON object, the handler's naming its run, step and trace."""
    _start(procs, tmp_path)
    harness.wait_for(
        lambda: all(_metrics_port(procs, name) for name in ROLES),
        timeout=30,
        what="every role serving metrics",
    )
    procs.assert_alive()
    _submit(names)
    harness.wait_for(
        lambda: list(harness.run_states(engine).values()) == ["completed"],
        timeout=60,
        interval=0.1,
        what="the run completed",
    )
    ports = {name: _metrics_port(procs, name) or 0 for name in ROLES}
    scheduler = _scrape(ports["scheduler"])
    assert scheduler["sasflow_steps_claimed_total"] == 3  # first, second, second again
    assert scheduler['sasflow_replies_applied_total{status="ok"}'] == 2
    assert scheduler['sasflow_runs_finished_total{state="completed",workflow="traced"}'] == 1
    second = 'sasflow_step_duration_seconds_count{agent="observed",step="second",workflow="traced"}'
    harness.wait_for(  # the expired first attempt finishes its nap after the run completed
        lambda: _scrape(ports["agent"]).get(second) == 2, timeout=10, what="both attempts timed"
    )
    agent = _scrape(ports["agent"])
    assert agent['sasflow_handler_retries_total{action="flaky",agent="observed"}'] == 1
    assert agent['sasflow_handler_outcomes_total{agent="observed",status="ok"}'] == 3
    assert agent['sasflow_breaker_open{agent="observed",dependency="remote"}'] == 0
    assert _scrape(ports["submitter"])['sasflow_runs_submitted_total{result="created"}'] == 1
    supervisor = _scrape(ports["supervisor"])
    assert supervisor["sasflow_sweep_expired_total"] == 1
    assert supervisor["sasflow_supervisor_leader"] == 1
    assert supervisor["sasflow_schedulers_alive"] == 1
    assert supervisor['sasflow_runs{state="running"}'] == 0
    assert supervisor["sasflow_supervisor_last_sweep_timestamp_seconds"] > 0
    for name, port in ports.items():
        served = _scrape(port)
        assert [s for s in served if "_created" in s] == [], name
        (info,) = [s for s in served if s.startswith("sasflow_build_info{")]
        assert f'role="{name}"' in info
        assert ("schema=" in info) is (name != "agent")
    with engine.connect() as conn:
        run_id, stored = conn.execute(select(runs.c.id, runs.c.trace_parent)).one()
    assert stored is not None
    assert stored.split("-")[1] == EXTERNAL_TRACE

    procs.stop_all()  # SIGTERM: each role flushes its spans on the way out
    spans = _spans(tmp_path)
    by_id = {s["context"]["span_id"]: s for s in spans}
    assert {s["context"]["trace_id"] for s in spans} == {f"0x{EXTERNAL_TRACE}"}
    orphans = [s["name"] for s in spans if s["parent_id"] not in {*by_id, f"0x{EXTERNAL_SPAN}"}]
    assert orphans == []
    services_seen = {s["resource"]["attributes"]["service.name"] for s in spans}
    assert services_seen == {f"sasflow-{name}" for name in ROLES}
    agent_queue, replies = names.agent("observed"), names.replies
    expected = {
        f"process {names.submit}",
        f"publish {agent_queue}",
        f"process {agent_queue}",
        f"publish {replies}",
        f"process {replies}",
        "supervisor expired",
        "run completed",
    }
    assert expected <= {s["name"] for s in spans}
    dispatches = [s for s in spans if s["name"] == f"publish {agent_queue}"]
    assert sorted(s["attributes"]["sasflow.step"] for s in dispatches) == [
        "first",
        "second",
        "second",
    ]
    assert all([e["name"] for e in s["events"]] == ["claimed"] for s in dispatches)
    handler = next(
        s
        for s in spans
        if s["name"] == f"process {agent_queue}" and s["attributes"]["sasflow.step"] == "first"
    )
    assert [e["name"] for e in handler["events"]] == ["retry"]
    assert handler["attributes"]["sasflow.breaker.state"] == "closed"
    assert handler["attributes"]["messaging.system"] == "rabbitmq"

    lines = _log_lines(procs, "agent")
    assert all(line["role"] == "agent" for line in lines)
    late = [line for line in lines if line["message"].startswith("late: attempt")]
    assert {line["attempt"] for line in late} == {1, 2}
    assert all(line["trace_id"] == EXTERNAL_TRACE and line["run_id"] == run_id for line in late)
