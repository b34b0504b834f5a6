"""`POST /v1/runs` past a workflow's bound, on a real `sasflow api` process (SASFLOW_MAX_BACKLOG
2, no scheduler: the runs stay waiting): 201 below the bound, 429 with `Retry-After` and the
problem body past it, an idempotent resubmission answered 200 all the same, the refusal
counted in the metrics (docs/backpressure.md). The 429 in OpenAPI: tests/api/test_responses.py,
on the same app without a server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, func, select

from sasflow.backpressure import RETRY_AFTER_S
from sasflow.store.schema import runs
from sasflow.transport.topology import Names
from tests.api.server import ApiServer, api_server, free_port, make_token

pytestmark = pytest.mark.integration

BOUND = 2


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def api(
    tmp_path: Path, database_url: str, broker_url: str, names: Names, metrics_port: int
) -> Iterator[ApiServer]:
    with api_server(
        tmp_path,
        database_url=database_url,
        broker_url=broker_url,
        namespace=names.namespace,
        env={"SASFLOW_MAX_BACKLOG": str(BOUND), "SASFLOW_METRICS_PORT": str(metrics_port)},
    ) as server:
        yield server


def _runs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(runs)).scalar_one())


def test_past_the_bound_429_with_retry_after_and_a_known_key_is_still_answered(
    api: ApiServer, engine: Engine, metrics_port: int
) -> None:
    token = make_token(engine, "shop", "submit", "read")
    with api.client(token) as http:
        below = [
            http.post("/v1/runs", json={"workflow": "pipeline", "key": f"k{i}", "input": {}})
            for i in range(BOUND)
        ]
        assert [r.status_code for r in below] == [201] * BOUND
        past = http.post("/v1/runs", json={"workflow": "pipeline", "key": "k9", "input": {}})
        keyless = http.post("/v1/runs", json={"workflow": "pipeline", "input": {}})
        again = http.post("/v1/runs", json={"workflow": "pipeline", "key": "k0", "input": {}})
        other = http.post("/v1/runs", json={"workflow": "diamond", "key": "d", "input": {}})
    assert past.status_code == 429
    assert past.headers["Retry-After"] == str(RETRY_AFTER_S)
    body = past.json()
    assert body["error"] == "backlog_full"
    assert (body["workflow"], body["backlog"], body["max_backlog"], body["retry_after"]) == (
        "pipeline",
        BOUND,
        BOUND,
        RETRY_AFTER_S,
    )
    assert "pipeline" in body["message"]
    assert keyless.status_code == 429
    assert (again.status_code, again.json()["id"]) == (200, below[0].json()["id"])
    assert other.status_code == 201, "the bound is per workflow"
    assert _runs(engine) == BOUND + 1
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    assert 'sasflow_submissions_refused_total{door="api",workflow="pipeline"} 2.0' in text


def test_a_batch_past_the_bound_refuses_the_runs_over_it_alone(
    api: ApiServer, engine: Engine
) -> None:
    """`POST /v1/runs/batch`: the first runs of a workflow up to its bound are recorded, the
    ones past it answered `backlog_full` (the answer carries `Retry-After`), and a known key
    past it is still answered with its run."""
    token = make_token(engine, "shop", "submit")
    with api.client(token) as http:
        first = http.post("/v1/runs", json={"workflow": "pipeline", "key": "b0", "input": {}})
        answer = http.post(
            "/v1/runs/batch",
            json={
                "runs": [
                    {"workflow": "pipeline", "key": "b1", "input": {}},
                    {"workflow": "pipeline", "key": "b2", "input": {}},
                    {"workflow": "diamond", "key": "d", "input": {}},
                    {"workflow": "pipeline", "key": "b0", "input": {}},
                ]
            },
        )
    assert answer.status_code == 200, answer.text
    assert answer.headers["Retry-After"] == str(RETRY_AFTER_S)
    items = answer.json()["runs"]
    assert [(i["status"], i.get("error")) for i in items] == [
        ("created", None),
        ("refused", "backlog_full"),
        ("created", None),
        ("duplicate", None),
    ]
    assert items[1]["retry_after"] == RETRY_AFTER_S
    assert items[3]["id"] == first.json()["id"]
    assert _runs(engine) == BOUND + 1
