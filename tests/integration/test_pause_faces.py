"""`sasflow runs pause|resume`, `sasflow agents pause|resume` and their HTTP routes on the real
database: the run's timeline and the audit say who and why, `runs show` and `agents list` show
what is paused, an ended run is a clear refusal (409 over HTTP), a `read` token gets 403."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, select

from sasflow import submit_run
from sasflow.cli.main import cli
from sasflow.store.db import make_engine
from sasflow.store.schema import audit
from sasflow.transport.topology import Names
from tests import services
from tests.api.server import ApiServer, api_server, make_token
from tests.apps import flow

pytestmark = pytest.mark.integration


@pytest.fixture
def sasflow(database_url: str) -> Any:
    def invoke(*args: str, exit_code: int = 0) -> Result:
        env = {"SASFLOW_DATABASE_URL": database_url, "SASFLOW_APP": "tests.apps.flow"}
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == exit_code, result.output
        return result

    return invoke


def _submit(engine: Engine, key: str) -> int:
    with engine.begin() as conn:
        return submit_run(
            conn, flow.registry, "charge", {"account": "a"}, key=key, namespace="t"
        ).run_id


def _audited(engine: Engine) -> list[tuple[str, str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(select(audit.c.actor, audit.c.action, audit.c.reason)).all()
    return [tuple(r) for r in rows]


def test_runs_pause_and_resume_from_the_cli(sasflow: Any, engine: Engine) -> None:
    first, second = _submit(engine, "k1"), _submit(engine, "k2")
    out = sasflow(
        "runs", "pause", str(first), str(second), "--reason", "hold", "--by", "ann"
    ).output
    assert out.splitlines() == [f"run {first} (pending) paused", f"run {second} (pending) paused"]
    shown = sasflow("runs", "show", str(first)).output
    assert f"run {first}: charge v1, key k1, pending, paused" in shown
    assert "step only waits: run paused by an operator" in shown
    again = sasflow("runs", "resume", str(first), "--reason", "go", "--output", "json").output
    assert json.loads(again) == [
        {"run_id": first, "state": "pending", "paused": False, "changed": True}
    ]
    timeline = json.loads(sasflow("runs", "show", str(first), "--output", "json").output)
    assert [(e["actor"], e["reason"]) for e in timeline["events"][-2:]] == [
        ("ann", "paused: hold"),
        (timeline["events"][-1]["actor"], "resumed: go"),
    ]
    missing = sasflow("runs", "pause", "999999", "--reason", "x", exit_code=1).output
    assert "no run with id 999999" in missing


def test_agents_pause_and_resume_from_the_cli(sasflow: Any, engine: Engine) -> None:
    out = sasflow("agents", "pause", "pay", "--action", "charge", "--reason", "psp", "--by", "ann")
    assert out.output.strip() == "agent pay action charge paused"
    listed = sasflow("agents", "list").output
    assert "paused: pay action charge by ann: psp" in listed
    twice = sasflow("agents", "pause", "pay", "--action", "charge", "--reason", "again").output
    assert twice.strip() == "agent pay action charge paused (it was already)"
    sasflow("agents", "resume", "pay", "--action", "charge", "--reason", "psp back", "--by", "bob")
    assert "paused:" not in sasflow("agents", "list").output
    assert _audited(engine) == [
        ("ann", "agents.pause", "psp"),
        ("bob", "agents.resume", "psp back"),
    ]
    blank = sasflow("agents", "pause", "pay", "--reason", " ", exit_code=1).output
    assert "needs a reason with text" in blank


@pytest.fixture(scope="module")
def module_engine(module_database: str) -> Iterator[Engine]:
    engine = make_engine(module_database, application_name="sasflow-test")
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def api(
    tmp_path_factory: pytest.TempPathFactory, module_database: str, broker_namespaces: set[str]
) -> Iterator[ApiServer]:
    names = Names(services.unique("sftest"))
    broker_namespaces.add(names.namespace)
    with api_server(
        tmp_path_factory.mktemp("api"),
        database_url=module_database,
        broker_url=services.broker_url(),
        namespace=names.namespace,
    ) as server:
        yield server


def test_pause_and_resume_over_http(api: ApiServer, module_engine: Engine) -> None:
    reader = make_token(module_engine, "pause-reader", "read")
    operator = make_token(module_engine, "pause-operator", "operate", "read")
    run_id = _submit(module_engine, "h1")
    with api.client(operator) as http:
        paused = http.post(f"/v1/runs/{run_id}/pause", json={"reason": "wait"})
        assert paused.json() == {"id": run_id, "state": "pending", "paused": True, "changed": True}
        assert http.get(f"/v1/runs/{run_id}").json()["run"]["paused"] is True
        resumed = http.post(f"/v1/runs/{run_id}/resume", json={"reason": "go"})
        assert (resumed.status_code, resumed.json()["paused"]) == (200, False)
        assert http.post("/v1/runs/999999/pause", json={"reason": "x"}).status_code == 404
        assert http.post(f"/v1/runs/{run_id}/pause", json={}).status_code == 422
        agent = http.post("/v1/agents/pay/pause", json={"reason": "psp", "action": "refund"})
        assert agent.json() == {"agent": "pay", "action": "refund", "paused": True, "changed": True}
        listed = http.get("/v1/agents").json()["paused"]
        assert [(p["agent"], p["action"], p["paused_by"]) for p in listed] == [
            ("pay", "refund", "pause-operator")
        ]
    with api.client(reader) as http:
        refused = http.post("/v1/agents/pay/resume", json={"reason": "x", "action": "refund"})
        assert refused.status_code == 403
    with api.client(operator) as http:
        done = http.post("/v1/agents/pay/resume", json={"reason": "ok", "action": "refund"})
        assert done.json()["changed"] is True
        assert http.get("/v1/agents").json()["paused"] == []
