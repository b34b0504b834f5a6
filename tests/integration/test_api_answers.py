"""What the schema fuzzer (tests/api/test_fuzz.py) found, each fixed and pinned here against a
real `sasflow api` process on PostgreSQL and RabbitMQ: a schedule reference that looks like
digits but is no bigint (500 before), a 405 naming one method of several, a body FastAPI could
not decode answered `bad_request`, and checks the engine made after the door (a 400 with
pydantic's dump, or a reason without text reaching the store) that the schema now makes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import Engine

from tests.api.server import ApiServer, make_token, module_api_fixture

pytestmark = pytest.mark.integration


api = module_api_fixture()


@pytest.fixture(scope="module")
def http(api: ApiServer, module_engine: Engine) -> Iterator[httpx.Client]:
    with api.client(make_token(module_engine, "answers", "read", "submit", "operate")) as client:
        yield client


def _field(response: httpx.Response) -> str:
    """The one field a 422 names (a value of a union type is named once per type tried:
    `body.rate.float`, `body.rate.str`)."""
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "validation_error", body
    [field] = {".".join(p["field"].split(".")[:2]) for p in body["fields"]}
    return field


@pytest.mark.parametrize(
    "ref",
    [
        "%C2%B2",  # '²': str.isdigit() says yes, int() says no
        str(2**63),  # digits beyond a bigint
        "1" * 5000,  # more digits than int() reads
        "%D9%A1%D9%A2",  # Arabic-Indic digits: a name, not the id 12
    ],
)
def test_a_schedule_reference_that_is_no_id_is_a_name(http: httpx.Client, ref: str) -> None:
    answer = http.get(f"/v1/schedules/{ref}")
    assert (answer.status_code, answer.json()["error"]) == (404, "schedule_not_found")
    trigger = http.post(f"/v1/schedules/{ref}/trigger")
    assert (trigger.status_code, trigger.json()["error"]) == (404, "schedule_not_found")


def test_a_405_lists_every_method_of_the_path(http: httpx.Client) -> None:
    answer = http.request("OPTIONS", "/v1/limits/payments")
    assert (answer.status_code, answer.json()["error"]) == (405, "method_not_allowed")
    assert answer.headers["allow"] == "DELETE, GET, PUT"
    assert http.patch("/v1/runs").headers["allow"] == "GET, POST"


def test_a_body_that_is_not_utf8_is_invalid_json(http: httpx.Client) -> None:
    for path in ("/v1/schedules/nightly/pause", "/v1/runs"):
        answer = http.post(
            path, content=b'{"reason": "\xff\xfe"}', headers={"Content-Type": "application/json"}
        )
        assert answer.json() == {"error": "invalid_json", "message": "the request body is not JSON"}
        assert answer.status_code == 400


def test_what_the_schema_says_is_refused_at_the_door(http: httpx.Client) -> None:
    """422 naming the field, where a 400 with a pydantic dump (a workflow name), a 400 from
    the engine (a limit's names and counts) or the store's own check (a reason) answered."""
    assert _field(http.post("/v1/runs", json={"workflow": "no such/name"})) == "body.workflow"
    assert _field(http.delete("/v1/limits/x", params={"reason": "\x01"})) == "query.reason"
    limit = {"agent": "echo", "concurrency": 1, "reason": "r"}
    assert _field(http.put("/v1/limits/Upper", json=limit)) == "path.name"
    assert _field(http.put("/v1/limits/x", json={**limit, "agent": "a b"})) == "body.agent"
    assert _field(http.put("/v1/limits/x", json={**limit, "concurrency": 10**6 + 1})) == (
        "body.concurrency"
    )
    assert _field(http.put("/v1/limits/x", json={**limit, "key": "input."})) == "body.key"
    assert _field(http.put("/v1/limits/x", json={**limit, "rate": 0})) == "body.rate"
    both = http.put("/v1/limits/x", json={**limit, "actions": ["a"], "dependency": "d"})
    assert (both.status_code, both.json()["message"]) == (
        400,
        "a limit selects actions or a dependency, not both",
    )
