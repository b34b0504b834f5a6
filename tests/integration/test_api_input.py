"""Input the database cannot hold never reaches it (issue: 500s found by a schema fuzzer):
integers beyond PostgreSQL's bigint in path ids and cursors, and NUL characters in a path, a
query or a body string, are each a 422 `validation_error` naming the field; reasons must carry
text and keep to their documented length. One `sasflow api` process serves the module."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import Engine

from sasflow.store.db import run_transaction
from sasflow.store.outbox.alerts import Alert, raise_alert
from tests.api.server import ApiServer, make_token, module_api_fixture

pytestmark = pytest.mark.integration

TOO_BIG = str(2**63)
"""One more than PostgreSQL's largest bigint."""


api = module_api_fixture()


@pytest.fixture(scope="module")
def http(api: ApiServer, module_engine: Engine) -> Iterator[httpx.Client]:
    with api.client(make_token(module_engine, "input", "read", "submit", "operate")) as client:
        yield client


def _refused(response: httpx.Response, field: str) -> str:
    """The answer is a 422 naming `field`; returns its message."""
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "validation_error", body
    fields = [f["field"] for f in body["fields"]]
    assert fields == [field], body
    message: str = body["fields"][0]["message"]
    return message


@pytest.mark.parametrize(
    ("method", "path", "field"),
    [
        ("GET", f"/v1/runs/{TOO_BIG}", "path.run_id"),
        ("POST", f"/v1/runs/{TOO_BIG}/cancel", "path.run_id"),
        ("POST", f"/v1/runs/{TOO_BIG}/resubmit", "path.run_id"),
        ("GET", f"/v1/runs?cursor={TOO_BIG}", "query.cursor"),
        ("GET", f"/v1/alerts/{TOO_BIG}", "path.alert_id"),
        ("POST", f"/v1/alerts/{TOO_BIG}/ack", "path.alert_id"),
    ],
)
def test_an_id_beyond_bigint_is_refused_naming_it(
    http: httpx.Client, method: str, path: str, field: str
) -> None:
    body = {"reason": "test"} if method == "POST" else None
    message = _refused(http.request(method, path, json=body), field)
    assert str(2**63 - 1) in message, message


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/runs?key=%00", "query.key"),
        ("/v1/runs?workflow=a%00b", "query.workflow"),
        ("/v1/alerts?kind=%00", "query.kind"),
        ("/v1/schedules/%00", "path.ref"),
        ("/v1/limits/%00", "path.name"),
    ],
)
def test_a_nul_in_a_path_or_a_query_is_refused_naming_it(
    http: httpx.Client, path: str, field: str
) -> None:
    assert "NUL" in _refused(http.get(path), field)


def test_a_nul_in_a_body_string_is_refused_naming_it(
    http: httpx.Client, module_engine: Engine
) -> None:
    submitted = http.post(
        "/v1/runs", json={"workflow": "pipeline", "key": "k\u0000", "input": {"text": "x"}}
    )
    assert "NUL" in _refused(submitted, "body.key")
    deep = http.post(
        "/v1/runs",
        json={"workflow": "pipeline", "key": "deep", "input": {"a": [{"b": "x\u0000"}]}},
    )
    assert "NUL" in _refused(deep, "body.input.a.0.b")
    cancel = http.post("/v1/runs/1/cancel", json={"reason": "\u0000"})
    assert "NUL" in _refused(cancel, "body.reason")
    escaped = http.post("/v1/runs/1/cancel", json={"reason": "a \\u0000 is not a NUL"})
    assert escaped.status_code == 404, "an escaped backslash is text: the run is unknown"


def test_a_reason_needs_text_and_keeps_to_its_length(
    http: httpx.Client, module_engine: Engine
) -> None:
    alert_id = run_transaction(
        module_engine, lambda conn: raise_alert(conn, Alert("stalled", "input-test", "look"))
    )
    assert alert_id is not None
    control = http.post(f"/v1/alerts/{alert_id}/ack", json={"reason": "\u0001\u0002\t"})
    assert "text" in _refused(control, "body.reason")
    too_long = http.post(f"/v1/alerts/{alert_id}/ack", json={"reason": "r" * 2001})
    assert "2000" in _refused(too_long, "body.reason")
    longest = http.post(f"/v1/alerts/{alert_id}/ack", json={"reason": "r" * 2000})
    assert longest.status_code == 200, longest.text
    assert longest.json()["acknowledge_reason"] == "r" * 2000
