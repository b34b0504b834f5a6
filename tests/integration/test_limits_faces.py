"""`sasflow limits ...` and /v1/limits on the real database: the operator's flow (set, list,
show, replace, delete), the audit trail with actor and reason, a clear error for each kind of
bad input; over HTTP the same, 403 for a `read` token's change, 404 for an unknown name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, select

from sasflow.cli.main import cli
from sasflow.store.db import make_engine
from sasflow.store.schema import audit
from sasflow.transport.topology import Names
from tests import services
from tests.api.server import ApiServer, api_server, make_token

pytestmark = pytest.mark.integration


@pytest.fixture
def sasflow(database_url: str) -> Any:
    def invoke(*args: str, exit_code: int = 0) -> Result:
        result = CliRunner().invoke(cli, list(args), env={"SASFLOW_DATABASE_URL": database_url})
        assert result.exit_code == exit_code, result.output
        return result

    return invoke


def _audited(engine: Engine, action: str) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(audit.c.actor, audit.c.reason).where(audit.c.action == action)
        ).all()
    return [(r.actor, r.reason) for r in rows]


def test_limits_cli_flow(sasflow: Any, engine: Engine) -> None:
    out = sasflow(
        "limits",
        "set",
        "payments",
        "--agent",
        "pay",
        "--rate",
        "6000/min",
        "--concurrency",
        "40",
        "--reason",
        "gateway quota",
        "--by",
        "ops@host",
    ).output
    assert out.strip() == "limit payments created: pay; 100/s (burst 100), 40 at once"
    sasflow(
        "limits",
        "set",
        "per-account",
        "--agent",
        "pay",
        "--action",
        "charge",
        "--key",
        "input.account",
        "--concurrency",
        "1",
        "--reason",
        "one at a time",
    )
    listed = json.loads(sasflow("limits", "list", "-o", "json").output)
    assert [(lim["name"], lim["description"]) for lim in listed] == [
        ("payments", "100/s (burst 100), 40 at once"),
        ("per-account", "1 at once, per input.account"),
    ]
    assert listed[0]["state"] == {
        "resolved": True,
        "actions": None,
        "in_flight": 0,
        "in_flight_keys": {},
        "tokens": 100.0,
        "ready": 0,
    }
    assert sasflow("limits", "list").output.startswith("2 limit(s)")
    shown = sasflow("limits", "show", "per-account").output
    assert "limit per-account: pay: charge; 1 at once, per input.account" in shown
    assert "last admitted never" in shown
    replaced = sasflow(
        "limits",
        "set",
        "payments",
        "--agent",
        "pay",
        "--rate",
        "50/s",
        "--burst",
        "10",
        "--disable",
        "--reason",
        "maintenance",
    ).output
    assert replaced.strip() == "limit payments replaced: pay; 50/s (burst 10)"
    assert sasflow("limits", "delete", "payments", "--reason", "done").output.strip() == (
        "limit payments deleted (50/s)"
    )
    assert [r[1] for r in _audited(engine, "limits.set")] == [
        "gateway quota",
        "one at a time",
        "maintenance",
    ]
    assert _audited(engine, "limits.set")[0][0] == "ops@host"
    assert [r[1] for r in _audited(engine, "limits.delete")] == ["done"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent", "pay", "--reason", "x"], "needs a rate, a concurrency or both"),
        (["--agent", "pay", "--rate", "fast", "--reason", "x"], "rate 'fast' must be"),
        (
            ["--agent", "pay", "--rate", "1/s", "--key", "output.x", "--reason", "x"],
            "key 'output.x'",
        ),
        (
            ["--agent", "pay", "--concurrency", "1", "--burst", "3", "--reason", "x"],
            "a burst needs a rate",
        ),
        (["--agent", "pay", "--concurrency", "1", "--reason", " "], "needs a reason"),
    ],
)
def test_a_bad_limit_is_refused_by_the_cli(sasflow: Any, args: list[str], message: str) -> None:
    result = sasflow("limits", "set", "bad", *args, exit_code=1)
    assert message in result.output


def test_an_unknown_limit_is_a_clear_error(sasflow: Any) -> None:
    assert "no flow limit named 'nope'" in sasflow("limits", "show", "nope", exit_code=1).output
    result = sasflow("limits", "delete", "nope", "--reason", "x", exit_code=1)
    assert "no flow limit named 'nope'" in result.output


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
    broker_namespaces.add(names.namespace)  # what it leaves goes in the session's sweep
    with api_server(
        tmp_path_factory.mktemp("api"),
        database_url=module_database,
        broker_url=services.broker_url(),
        namespace=names.namespace,
    ) as server:
        yield server


def test_limits_over_http(api: ApiServer, module_engine: Engine) -> None:
    reader = make_token(module_engine, "limits-reader", "read")
    operator = make_token(module_engine, "limits-operator", "operate", "read")
    body = {"agent": "pay", "rate": "100/s", "concurrency": 40, "reason": "quota"}
    with api.client(operator) as http:
        created = http.put("/v1/limits/payments", json=body)
        assert created.status_code == 201, created.text
        assert (created.json()["description"], created.json()["created"]) == (
            "100/s (burst 100), 40 at once",
            True,
        )
        replaced = http.put("/v1/limits/payments", json={**body, "rate": 50})
        assert (replaced.status_code, replaced.json()["rate"]) == (200, 50.0)
        refused = http.put("/v1/limits/payments", json={"agent": "pay", "reason": "x"})
        assert refused.status_code == 400
        assert "needs a rate, a concurrency or both" in refused.json()["message"]
    with api.client(reader) as http:
        assert [lim["name"] for lim in http.get("/v1/limits").json()["limits"]] == ["payments"]
        shown = http.get("/v1/limits/payments").json()
        assert (shown["updated_by"], shown["state"]["tokens"]) == ("limits-operator", 50.0)
        assert http.get("/v1/limits/nope").status_code == 404
        assert http.put("/v1/limits/payments", json=body).status_code == 403
        assert http.delete("/v1/limits/payments", params={"reason": "x"}).status_code == 403
    with api.client(operator) as http:
        assert http.delete("/v1/limits/payments", params={"reason": "done"}).json() == {
            "name": "payments",
            "deleted": True,
        }
        assert http.delete("/v1/limits/payments", params={"reason": "again"}).status_code == 404
    assert _audited(module_engine, "limits.delete") == [("limits-operator", "done")]
