"""The HTTP API, served by a real `sasflow api` process on PostgreSQL and RabbitMQ: auth, the
one error shape, every REST endpoint and its error statuses, the audit trail.

One server and one database serve the whole module (a server takes seconds to start): each
test uses its own token names, keys and workflows, and asserts on its own rows only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime

import httpx
import pytest
from sqlalchemy import Engine, select

from sasflow.store.db import run_transaction
from sasflow.store.outbox.alerts import Alert, raise_alert
from sasflow.store.schema import events, runs
from tests.api.server import ApiServer, free_port, make_token, module_api_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def api(
    tmp_path_factory: pytest.TempPathFactory,
    module_database: str,
    metrics_port: int,
    broker_namespaces: set[str],
) -> Iterator[ApiServer]:
    with module_api_server(
        tmp_path_factory,
        module_database,
        broker_namespaces,
        env={"SASFLOW_METRICS_PORT": str(metrics_port)},
    ) as server:
        yield server


def _error(response: object) -> dict[str, object]:
    body: dict[str, object] = response.json()  # type: ignore[attr-defined]
    assert set(body) >= {"error", "message"}, body
    return body


def test_health_readiness_and_openapi(api: ApiServer) -> None:
    """/healthz and /readyz answer without a token; OpenAPI and the docs page are served."""
    with api.client() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").json() == {"status": "ready", "database": "ok", "broker": "ok"}
        paths = http.get("/openapi.json").json()["paths"]
        assert {"/v1/runs", "/v1/runs/{run_id}", "/v1/alerts"} <= set(paths)
        assert http.get("/docs").status_code == 200


def test_auth_says_why_with_401_and_403(api: ApiServer, module_engine: Engine) -> None:
    """No token, a malformed header, an unknown or revoked token -> 401; a token without
    the scope -> 403; each with the one error shape and the reason."""
    reader = make_token(module_engine, "reader", "read")
    with api.client() as http:
        missing = http.get("/v1/runs")
        assert (missing.status_code, _error(missing)["error"]) == (401, "unauthorized")
        assert missing.headers["www-authenticate"].startswith("Bearer")
        basic = http.get("/v1/runs", headers={"Authorization": "Basic eDp5"})
        assert (basic.status_code, _error(basic)["error"]) == (401, "unauthorized")
        wrong = http.get("/v1/runs", headers={"Authorization": "Bearer sft_nope"})
        assert (wrong.status_code, _error(wrong)["error"]) == (401, "invalid_token")
    with api.client(reader) as http:
        assert http.get("/v1/runs").status_code == 200
        denied = http.post("/v1/runs", json={"workflow": "pipeline"})
        assert denied.status_code == 403
        assert _error(denied) == {
            "error": "forbidden",
            "message": "token 'reader' lacks the 'submit' scope (it has: read)",
        }
    from sasflow.ops import tokens  # noqa: PLC0415 - the revocation under test

    run_transaction(
        module_engine, lambda conn: tokens.revoke(conn, "reader", actor="t", reason="r")
    )
    with api.client(reader) as http:
        revoked = http.get("/v1/runs")
        assert (revoked.status_code, _error(revoked)["error"]) == (401, "invalid_token")


def test_bad_bodies_get_the_error_shape(api: ApiServer, module_engine: Engine) -> None:
    """Validation -> 422 naming the field; not JSON -> 400; over 1 MiB -> 413; nested too
    deep -> 400; unknown workflow -> 404 with the known names; unknown run -> 404."""
    token = make_token(module_engine, "submitter", "submit", "read")
    with api.client(token) as http:
        invalid = http.post("/v1/runs", json={"workflow": "pipeline", "priority": "high"})
        assert invalid.status_code == 422
        assert _error(invalid)["fields"] == [
            {
                "field": "body.priority",
                "message": "Input should be a valid integer, unable to parse string as an integer",
            }
        ]
        not_json = http.post(
            "/v1/runs", content=b"{nope", headers={"Content-Type": "application/json"}
        )
        assert (not_json.status_code, _error(not_json)["error"]) == (400, "invalid_json")
        big = http.post(
            "/v1/runs",
            content=json.dumps({"workflow": "pipeline", "input": {"x": "a" * 1_100_000}}),
            headers={"Content-Type": "application/json"},
        )
        assert (big.status_code, _error(big)["error"]) == (413, "body_too_large")
        deep = http.post(
            "/v1/runs",
            content='{"workflow": "pipeline", "input": {"x": ' + "[" * 80 + "]" * 80 + "}}",
            headers={"Content-Type": "application/json"},
        )
        assert (deep.status_code, _error(deep)["error"]) == (400, "too_deeply_nested")
        unknown = http.post("/v1/runs", json={"workflow": "nope"})
        assert unknown.status_code == 404
        assert _error(unknown)["known"] == ["diamond", "pipeline", "sleepy"]
        no_run = http.get("/v1/runs/999999")
        assert (no_run.status_code, _error(no_run)["error"]) == (404, "run_not_found")
        no_route = http.get("/v1/nothing")
        assert (no_route.status_code, _error(no_route)["error"]) == (404, "not_found")


def test_submit_is_idempotent_and_records_who(api: ApiServer, module_engine: Engine) -> None:
    """201 with Location and the run; the same key again -> 200 and the same run; the same key
    with another input -> 200, the run as recorded, `input_differs` and a message; the run
    carries the token's name (submitted_by) and its first event the token as actor."""
    token = make_token(module_engine, "shop", "submit", "read")
    body = {"workflow": "diamond", "input": {"text": "hi"}, "key": "order-1", "priority": 7}
    with api.client(token) as http:
        first = http.post("/v1/runs", json=body)
        assert first.status_code == 201
        run_id = first.json()["id"]
        assert first.headers["location"] == f"/v1/runs/{run_id}"
        assert first.json()["run"]["submitted_by"] == "shop"
        again = http.post("/v1/runs", json=body)
        assert (again.status_code, again.json()["id"], again.json()["created"]) == (
            200,
            run_id,
            False,
        )
        assert (again.json()["input_differs"], again.json()["message"]) == (False, None)
        assert first.json()["input_differs"] is False
        other = http.post("/v1/runs", json={**body, "input": {"text": "bye"}})
        assert (other.status_code, other.json()["id"], other.json()["created"]) == (
            200,
            run_id,
            False,
        )
        assert other.json()["input_differs"] is True
        assert other.json()["message"] == (
            f"key 'order-1' names run {run_id} of diamond, recorded with another input: that "
            "run is kept as it is and this input was not used (submit it with another key)"
        )
        assert other.json()["run"]["input"] == {"text": "hi"}
        detail = http.get(f"/v1/runs/{run_id}").json()
    assert [s["name"] for s in detail["steps"]] == ["start", "left", "right", "end"]
    assert detail["run"]["priority"] == 7
    with module_engine.connect() as conn:
        who = select(runs.c.submitted_by).where(runs.c.id == run_id)
        assert conn.execute(who).scalar_one() == "shop"
        actors = conn.execute(select(events.c.actor).where(events.c.run_id == run_id))
        assert actors.scalars().all() == ["shop"]


def test_submit_with_start_at_delays_the_first_steps(api: ApiServer, module_engine: Engine) -> None:
    """`start_at` becomes the first step's `not_before`; a time without an offset is 422."""
    token = make_token(module_engine, "later", "submit", "read")
    body = {"workflow": "diamond", "key": "later-1", "start_at": "2030-01-01T09:00:00+01:00"}
    with api.client(token) as http:
        naive = http.post("/v1/runs", json={**body, "start_at": "2030-01-01T09:00:00"})
        assert naive.status_code == 422, naive.text
        made = http.post("/v1/runs", json=body)
        assert made.status_code == 201, made.text
        detail = http.get(f"/v1/runs/{made.json()['id']}").json()
    start = next(s for s in detail["steps"] if s["name"] == "start")
    assert datetime.fromisoformat(start["not_before"]) == datetime.fromisoformat(body["start_at"])


def test_list_pages_with_a_cursor_and_filters(api: ApiServer, module_engine: Engine) -> None:
    """GET /v1/runs pages newest first; next_cursor leads to the next page, null on the last;
    state, workflow, key and text filter."""
    token = make_token(module_engine, "lister", "submit", "read")
    with api.client(token) as http:
        ids = [
            http.post("/v1/runs", json={"workflow": "sleepy", "key": f"k{i}"}).json()["id"]
            for i in range(5)
        ]
        seen: list[int] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, str | int] = {"workflow": "sleepy", "limit": 2}
            if cursor is not None:
                params["cursor"] = cursor
            page = http.get("/v1/runs", params=params).json()
            seen += [r["id"] for r in page["runs"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == ids[::-1]
        assert pages == 3  # 2 + 2 + 1
        by_key = http.get("/v1/runs", params={"key": "k2"}).json()["runs"]
        assert [r["id"] for r in by_key] == [ids[2]]
        pending = http.get(
            "/v1/runs", params={"state": ["pending", "running"], "workflow": "sleepy"}
        ).json()
        assert [r["id"] for r in pending["runs"]] == ids[::-1]
        done = http.get("/v1/runs", params={"state": "completed", "workflow": "sleepy"}).json()
        assert done == {"runs": [], "next_cursor": None}
        assert http.get("/v1/runs", params={"state": "done"}).status_code == 422
        noted = http.post(
            "/v1/runs", json={"workflow": "sleepy", "key": "k9", "input": {"note": "FindMe"}}
        ).json()["id"]
        found = http.get("/v1/runs", params={"text": "findme"}).json()["runs"]
        assert [r["id"] for r in found] == [noted]  # the text is in its input only


def test_cancel_resubmit_and_alerts_are_audited_with_the_token(
    api: ApiServer, module_engine: Engine
) -> None:
    """cancel needs operate and a reason; cancelling twice -> 409; resubmit brings the run
    back; alerts are listed and acknowledged once (409 the second time); every action's
    actor is the token's name."""
    submitter = make_token(module_engine, "orders", "submit", "read")
    operator = make_token(module_engine, "ops-team", "operate", "read")
    with api.client(submitter) as http:
        run_id = http.post("/v1/runs", json={"workflow": "pipeline", "key": "c1"}).json()["id"]
        refused = http.post(f"/v1/runs/{run_id}/cancel", json={"reason": "x"})
        assert refused.status_code == 403
    with api.client(operator) as http:
        no_reason = http.post(f"/v1/runs/{run_id}/cancel", json={})
        assert _error(no_reason)["fields"][0]["field"] == "body.reason"  # type: ignore[index]
        cancelled = http.post(f"/v1/runs/{run_id}/cancel", json={"reason": "customer left"})
        assert cancelled.status_code == 200
        assert cancelled.json() == {
            "id": run_id,
            "state": "cancelled",
            "cancelled_steps": ["a", "b"],
        }
        twice = http.post(f"/v1/runs/{run_id}/cancel", json={"reason": "again"})
        assert (twice.status_code, _error(twice)["error"]) == (409, "invalid_action")
        resubmitted = http.post(f"/v1/runs/{run_id}/resubmit", json={"reason": "came back"})
        assert resubmitted.status_code == 200
        assert resubmitted.json()["ready_steps"] == ["a"]
        wrong_step = http.post(
            f"/v1/runs/{run_id}/resubmit", json={"reason": "r", "from_step": "a"}
        )
        assert wrong_step.status_code == 409

        alert_id = run_transaction(
            module_engine,
            lambda conn: raise_alert(
                conn, Alert(kind="step_failed", subject="s1", message="boom", run_id=run_id)
            ),
        )
        listed = http.get("/v1/alerts").json()["alerts"]
        assert [a["id"] for a in listed] == [alert_id]
        assert http.get(f"/v1/alerts/{alert_id}").json()["message"] == "boom"
        acked = http.post(f"/v1/alerts/{alert_id}/ack", json={"reason": "seen"})
        assert acked.json()["acknowledged_by"] == "ops-team"
        again = http.post(f"/v1/alerts/{alert_id}/ack", json={"reason": "seen"})
        assert (again.status_code, _error(again)["error"]) == (409, "already_acknowledged")
        missing = http.get("/v1/alerts/999999")
        assert (missing.status_code, _error(missing)["error"]) == (404, "alert_not_found")
    with module_engine.connect() as conn:
        run_events = conn.execute(
            select(events.c.actor, events.c.reason)
            .where(events.c.run_id == run_id, events.c.entity == "run")
            .order_by(events.c.id)
        ).all()
    assert [tuple(e) for e in run_events] == [
        ("orders", "received"),
        ("ops-team", "cancelled: customer left"),
        ("ops-team", "resubmitted: came back"),
    ]


def test_metrics_count_requests_by_route_template_not_by_path(
    api: ApiServer, module_engine: Engine, metrics_port: int
) -> None:
    """With --metrics-port the server counts each request by method, route template and
    status on its own /metrics port; an unknown path is `unmatched`, not a label of its own."""
    reader = make_token(module_engine, "metrics-reader", "read")
    with api.client(reader) as http:
        assert http.get("/v1/runs/999999999").status_code == 404
        assert http.get("/no/such/path/4711").status_code == 404
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    assert (
        'sasflow_http_requests_total{method="GET",route="/v1/runs/{run_id}",status="404"}' in text
    )
    assert 'sasflow_http_requests_total{method="GET",route="unmatched",status="404"}' in text
    assert "/no/such/path" not in text, "an unknown path is not a label"
    assert 'route="/v1/runs/999999999"' not in text, "a concrete path is not a label"
    assert 'sasflow_http_request_duration_seconds_count{route="/v1/runs/{run_id}"}' in text


def test_incidents_are_listed_shown_with_their_alerts_and_acknowledged_together(
    api: ApiServer, module_engine: Engine
) -> None:
    """Alerts of one cause are one incident; its page previews what an acknowledgement takes
    (its open alerts); acknowledging it takes them all, once (409 the second time)."""
    reader = make_token(module_engine, "viewer", "read")
    operator = make_token(module_engine, "incident-team", "operate", "read")
    detail = {"step": "ship", "error": {"type": "Refused", "message": "parcel 12 refused"}}
    with module_engine.begin() as conn:
        alert_ids = [
            raise_alert(
                conn,
                Alert("step_failed", f"api-{i}", f"m{i}", detail=detail, workflow="shipping"),
            )
            for i in range(3)
        ]
    with api.client(reader) as http:
        [incident] = [
            i for i in http.get("/v1/incidents").json()["incidents"] if i["workflow"] == "shipping"
        ]
        assert (incident["alert_count"], incident["acknowledged"]) == (3, False)
        assert (
            incident["cause"]
            == "step_failed in shipping at step 'ship': Refused: parcel <n> refused"
        )
        shown = http.get(f"/v1/incidents/{incident['id']}").json()
        assert ([a["id"] for a in shown["alerts"]], shown["open_alerts"]) == (alert_ids, 3)
        forbidden = http.post(f"/v1/incidents/{incident['id']}/ack", json={"reason": "x"})
        assert forbidden.status_code == 403
    with api.client(operator) as http:
        acked = http.post(f"/v1/incidents/{incident['id']}/ack", json={"reason": "carrier down"})
        assert acked.status_code == 200
        assert acked.json()["acknowledged_by"] == "incident-team"
        assert acked.json()["alerts_acknowledged"] == 3
        again = http.post(f"/v1/incidents/{incident['id']}/ack", json={"reason": "again"})
        assert (again.status_code, _error(again)["error"]) == (409, "already_acknowledged")
        missing = http.get("/v1/incidents/999999")
        assert (missing.status_code, _error(missing)["error"]) == (404, "incident_not_found")
        for alert_id in alert_ids:
            alert = http.get(f"/v1/alerts/{alert_id}").json()
            assert (alert["acknowledged_by"], alert["incident_id"]) == (
                "incident-team",
                incident["id"],
            )
