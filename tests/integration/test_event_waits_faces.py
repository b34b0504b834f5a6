"""Event waits end to end on PostgreSQL and RabbitMQ: a scheduler and an agent run the `order`
workflow (tests/apps/events.py) whose middle step waits for `payment_confirmed`; the event
arrives by `sasflow events send` (before the run even exists), by a message on `<ns>.events`
(after the wait opened) and by `POST /v1/events`; the run's history shows the event."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, select

from sasflow.cli.main import cli
from sasflow.store.db import make_engine
from sasflow.store.schema import events
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.server import ApiServer, api_server, make_token
from tests.apps.events import registry, shop

pytestmark = pytest.mark.integration

RESCAN = 30.0


@pytest.fixture
def sasflow(database_url: str, names: Names) -> Any:
    def invoke(*args: str, exit_code: int = 0) -> Result:
        env = {"SASFLOW_DATABASE_URL": database_url, "SASFLOW_NAMESPACE": names.namespace}
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == exit_code, result.output
        return result

    return invoke


def _run_of(engine: Engine, run_id: int) -> dict[str, Any]:
    return {r.name: r for r in harness.step_rows(engine, run_id)}


def _completed(engine: Engine, run_id: int) -> bool:
    return harness.run_states(engine).get(run_id) == "completed"


def test_events_by_cli_before_and_by_amqp_after_the_wait_opens_complete_their_runs(
    engine: Engine, database_url: str, names: Names, sasflow: Any
) -> None:
    sent = sasflow(
        "events",
        "send",
        "payment_confirmed",
        "--correlation",
        "A-1",
        "--id",
        "evt-1",
        "--payload",
        '{"amount": 12}',
    ).output
    assert sent.startswith("event payment_confirmed evt-1 stored")
    assert sent.rstrip().endswith("waiting for its wait to open")
    listed = json.loads(sasflow("events", "list", "--unmatched", "-o", "json").output)
    assert [(e["event_id"], e["source"]) for e in listed] == [("evt-1", "cli")]
    early = harness.submit(
        engine, registry, names, "order", key="A-1", run_input={"order_id": "A-1"}
    )
    late = harness.submit(
        engine, registry, names, "order", key="B-2", run_input={"order_id": "B-2"}
    )
    with harness.running(
        harness.scheduler(engine, database_url, registry, names, rescan_interval=RESCAN),
        harness.agent(shop, names),
        harness.submitter(engine, registry, names),
    ):
        harness.wait_for(lambda: _completed(engine, early), timeout=20, what="the early run")
        harness.wait_for(
            lambda: _run_of(engine, late)["paid"].state == "pending", what="the late wait opens"
        )
        harness.publish_raw(names.events, b"not json")
        harness.publish_raw(
            names.events,
            json.dumps(
                {"name": "payment_confirmed", "correlation": "B-2", "id": "evt-2", "payload": 7}
            ).encode(),
        )
        harness.wait_for(lambda: _completed(engine, late), timeout=20, what="the late run")
        [dead] = harness.dead_letters(names, 1)
    assert "invalid event" in dead["reason"]
    assert _run_of(engine, early)["paid"].output == {"amount": 12}
    assert _run_of(engine, early)["paid"].attempt == 0  # no agent ran it
    assert _run_of(engine, late)["paid"].output == 7
    with engine.connect() as conn:
        history = conn.execute(
            select(events.c.run_id, events.c.detail).where(events.c.reason == "event")
        ).all()
    assert sorted((r.run_id, r.detail["event_id"]) for r in history) == [
        (early, "evt-1"),
        (late, "evt-2"),
    ]
    again = sasflow(
        "events",
        "send",
        "payment_confirmed",
        "--correlation",
        "A-1",
        "--id",
        "evt-1",
        "-o",
        "json",
    ).output
    assert json.loads(again) == {
        "id": listed[0]["id"],
        "duplicate": True,
        "matched": True,
        "step_id": _run_of(engine, early)["paid"].id,
        "run_id": early,
    }


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
        app="tests.apps.events",
    ) as server:
        yield server


def test_post_v1_events_stores_once_names_a_bad_field_and_needs_the_submit_scope(
    api: ApiServer, module_engine: Engine
) -> None:
    sender = make_token(module_engine, "event-sender", "submit", "read")
    reader = make_token(module_engine, "event-reader", "read")
    event = {"name": "payment_confirmed", "correlation": 42, "id": "evt-9", "payload": {"x": 1}}
    with api.client(sender) as http:
        first = http.post("/v1/events", json=event)
        assert first.status_code == 201, first.text
        assert first.json() | {"id": 0} == {
            "id": 0,
            "duplicate": False,
            "matched": False,
            "step_id": None,
            "run_id": None,
        }
        again = http.post("/v1/events", json=event)
        assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
        schema = http.post("/v1/events", json={**event, "id": ""})
        assert (schema.status_code, schema.json()["fields"][0]["field"]) == (422, "body.id")
        refused = http.post("/v1/events", json={**event, "id": "evt-10", "correlation": "c" * 201})
        assert refused.status_code == 400
        assert (refused.json()["error"], refused.json()["fields"][0]["field"]) == (
            "invalid_input",
            "correlation",
        )
        listed = http.get("/v1/events", params={"unmatched": "true"}).json()["events"]
        assert [(e["event_id"], e["correlation"], e["source"]) for e in listed] == [
            ("evt-9", "42", "api")
        ]
    with api.client(reader) as http:
        assert http.post("/v1/events", json=event).status_code == 403
