"""`POST /v1/runs/batch` on a real `sasflow api` process (PostgreSQL, RabbitMQ): one answer
per run in the request's order (created, duplicate, refused with its code), all recorded in
one transaction; a body that does not validate is refused whole, naming the run's index.
Past a workflow's bound: tests/integration/test_backpressure_api.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, select

from sasflow.api.models import MAX_BATCH
from sasflow.client import Client
from sasflow.store.schema import events, runs
from tests.api.server import ApiServer, make_token, module_api_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def api(
    tmp_path_factory: pytest.TempPathFactory, module_database: str, broker_namespaces: set[str]
) -> Iterator[ApiServer]:
    with module_api_server(tmp_path_factory, module_database, broker_namespaces) as server:
        yield server


def test_each_run_answered_in_order_created_duplicate_or_refused(
    api: ApiServer, module_engine: Engine
) -> None:
    token = make_token(module_engine, "batcher", "submit", "read")
    with api.client(token) as http:
        known = http.post("/v1/runs", json={"workflow": "pipeline", "key": "b-known", "input": {}})
        assert known.status_code == 201
        answer = http.post(
            "/v1/runs/batch",
            json={
                "runs": [
                    {"workflow": "pipeline", "key": "b-z", "input": {"text": "z"}, "priority": 3},
                    {"workflow": "pipeline", "key": "b-known", "input": {"other": 1}},
                    {"workflow": "nosuch", "key": "b-x"},
                    {"workflow": "pipeline", "key": "b-a", "input": {"text": "a"}},
                    {"workflow": "pipeline", "key": "b-z", "input": {"text": "z"}},
                ]
            },
        )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    items = body["runs"]
    assert [(i["index"], i["status"], i.get("key")) for i in items] == [
        (0, "created", "b-z"),
        (1, "duplicate", "b-known"),
        (2, "refused", None),
        (3, "created", "b-a"),
        (4, "duplicate", "b-z"),
    ]
    assert (body["created"], body["duplicates"], body["refused"]) == (2, 2, 1)
    assert items[1]["id"] == known.json()["id"]
    assert items[1]["input_differs"] is True
    assert "another input" in items[1]["message"]
    assert items[2]["error"] == "unknown_workflow"
    assert "nosuch" in items[2]["message"]
    assert items[4]["id"] == items[0]["id"]
    assert items[0]["id"] < items[3]["id"], "run ids follow the request's order"
    with module_engine.connect() as conn:
        recorded = conn.execute(
            select(runs.c.id, runs.c.priority, runs.c.submitted_by).where(
                runs.c.id.in_([items[0]["id"], items[3]["id"]])
            )
        ).all()
        firsts = conn.execute(
            select(events.c.actor).where(events.c.run_id == items[0]["id"])
        ).scalars()
        assert list(firsts) == ["batcher"]
    assert sorted(recorded) == [
        (items[0]["id"], 3, "batcher"),
        (items[3]["id"], 0, "batcher"),
    ]


def test_a_body_that_does_not_validate_names_the_runs_index(
    api: ApiServer, module_engine: Engine
) -> None:
    token = make_token(module_engine, "batcher-bad", "submit")
    with api.client(token) as http:
        bad = http.post(
            "/v1/runs/batch",
            json={
                "runs": [
                    {"workflow": "pipeline", "key": "v-1"},
                    {"workflow": "pipeline", "key": "v-2", "priority": 5000},
                ]
            },
        )
        empty = http.post("/v1/runs/batch", json={"runs": []})
        too_many = http.post(
            "/v1/runs/batch",
            json={"runs": [{"workflow": "pipeline"} for _ in range(MAX_BATCH + 1)]},
        )
    assert bad.status_code == 422
    assert [f["field"] for f in bad.json()["fields"]] == ["body.runs.1.priority"]
    assert empty.status_code == 422
    assert too_many.status_code == 422
    with module_engine.connect() as conn:
        keys = conn.execute(select(runs.c.business_key).where(runs.c.business_key.like("v-%")))
        assert list(keys) == []


def test_the_sdk_submits_a_batch(api: ApiServer, module_engine: Engine) -> None:
    """`sasflow.client.Client.submit_many`: the answers of `POST /v1/runs/batch`, in order."""
    token = make_token(module_engine, "batcher-sdk", "submit")
    with Client(api.base_url, token) as client:  # the module's server: plain HTTP
        answers = client.submit_many(
            [
                {"workflow": "pipeline", "key": "sdk-1", "input": {"text": "1"}},
                {"workflow": "pipeline", "key": "sdk-1", "input": {"text": "1"}},
                {"workflow": "nosuch"},
            ]
        )
    assert [(a["index"], a["status"]) for a in answers] == [
        (0, "created"),
        (1, "duplicate"),
        (2, "refused"),
    ]
    assert answers[1]["id"] == answers[0]["id"]
