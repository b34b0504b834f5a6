"""`sasflow runs unpark|fail`, `runs list --parked`, `runs show` and the HTTP routes
`/v1/runs/{id}/unpark|fail` on the real database: what is parked shows, the timeline says who
and why, a run with nothing parked is a no-op to unpark and a clear refusal to fail (409 over
HTTP), a `read` token gets 403."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine

from sasflow.cli.main import cli
from sasflow.store.db import make_engine
from sasflow.transport.topology import Names
from tests import services
from tests.api.server import ApiServer, api_server, make_token
from tests.parking import park_by_failures, step_state, submit

pytestmark = pytest.mark.integration


@pytest.fixture
def sasflow(database_url: str) -> Any:
    def invoke(*args: str, exit_code: int = 0) -> Result:
        env = {"SASFLOW_DATABASE_URL": database_url, "SASFLOW_APP": "tests.apps.parking"}
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == exit_code, result.output
        return result

    return invoke


def test_runs_list_show_unpark_and_fail_from_the_cli(sasflow: Any, engine: Engine) -> None:
    first = park_by_failures(engine, key="k1")
    second = park_by_failures(engine, key="k2")
    other = submit(engine, "fails", "k3")
    listed = json.loads(sasflow("runs", "list", "--parked", "--output", "json").output)
    assert sorted(r["id"] for r in listed) == [first, second]
    assert all(r["parked"] for r in listed)
    assert "running (parked)" in sasflow("runs", "list").output
    shown = sasflow("runs", "show", str(first)).output
    assert f"run {first}: parks v1, key k1, running, parked: call" in shown
    assert "step call waits: parked: an operator unparks or fails it" in shown
    out = sasflow("runs", "unpark", str(first), "--reason", "partner fixed", "--by", "ann")
    assert out.output.splitlines() == [f"run {first} (running): unparked call"]
    assert step_state(engine, first, "call") == "pending"
    again = sasflow("runs", "unpark", str(first), "--reason", "twice", "--output", "json").output
    assert json.loads(again) == [
        {"run_id": first, "state": "running", "steps": [], "changed": False}
    ]
    failed = sasflow("runs", "fail", str(second), "--reason", "order void", "--by", "bob").output
    assert failed.splitlines() == [f"run {second} (error): failed call"]
    refused = sasflow("runs", "fail", str(other), "--reason", "x", exit_code=1).output
    assert "has no parked step" in refused
    blank = sasflow("runs", "unpark", str(first), "--reason", " ", exit_code=1).output
    assert "needs a reason with text" in blank
    timeline = json.loads(sasflow("runs", "show", str(second), "--output", "json").output)
    assert ("bob", "failed: order void") in [(e["actor"], e["reason"]) for e in timeline["events"]]
    assert json.loads(sasflow("runs", "list", "--parked", "--output", "json").output) == []


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


def test_unpark_and_fail_over_http(api: ApiServer, module_engine: Engine) -> None:
    reader = make_token(module_engine, "park-reader", "read")
    operator = make_token(module_engine, "park-operator", "operate", "read")
    first = park_by_failures(module_engine, key="h1")
    second = park_by_failures(module_engine, key="h2")
    with api.client(reader) as http:
        assert http.post(f"/v1/runs/{first}/unpark", json={"reason": "x"}).status_code == 403
        page = http.get("/v1/runs", params={"parked": "true"}).json()["runs"]
        assert sorted(r["id"] for r in page) == [first, second]
        assert all(r["parked"] for r in page)
        assert http.get(f"/v1/runs/{first}").json()["run"]["parked"] == ["call"]
    with api.client(operator) as http:
        done = http.post(f"/v1/runs/{first}/unpark", json={"reason": "fixed"})
        assert done.json() == {"id": first, "state": "running", "steps": ["call"], "changed": True}
        failed = http.post(f"/v1/runs/{second}/fail", json={"reason": "void"})
        assert failed.json() == {"id": second, "state": "error", "steps": ["call"], "changed": True}
        again = http.post(f"/v1/runs/{second}/fail", json={"reason": "void"})
        assert (again.status_code, again.json()["error"]) == (409, "invalid_action")
        assert http.post("/v1/runs/999999/unpark", json={"reason": "x"}).status_code == 404
        assert http.post(f"/v1/runs/{first}/unpark", json={}).status_code == 422
        detail = http.get(f"/v1/runs/{first}").json()
    assert detail["run"]["parked"] == []
    assert ("park-operator", "unparked: fixed") in [
        (e["actor"], e["reason"]) for e in detail["events"]
    ]
