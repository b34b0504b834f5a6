"""`sasflow api` on the embedded default (a SQLite file, the in-process bus): the same REST
face, tokens and errors, and callbacks written with the run's end."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, select

from sasflow.ops import cancel as cancel_ops
from sasflow.states import RunState
from sasflow.store.db import run_transaction
from sasflow.store.schema import callbacks
from tests.api.server import ApiServer, api_server, make_token


@pytest.fixture
def api(tmp_path: Path, sqlite_url: str) -> Iterator[ApiServer]:
    with api_server(
        tmp_path, database_url=sqlite_url, broker_url="memory://", namespace="embedded"
    ) as server:
        yield server


def test_rest_on_sqlite(api: ApiServer, sqlite_engine: Engine) -> None:
    """Submit (201, then 200 for the same key), read, list, 401 and 404; /readyz is ready
    (the in-process bus has nothing to reach); a run with a callback_url that ends (here:
    cancelled) has its callback in the outbox."""
    token = make_token(sqlite_engine, "local", "submit", "read")
    with api.client() as anonymous:
        assert anonymous.get("/v1/runs").status_code == 401
        assert anonymous.get("/readyz").json()["status"] == "ready"
    body = {
        "workflow": "pipeline",
        "input": {"text": "x"},
        "key": "e1",
        "callback_url": "http://127.0.0.1:9/hook",
    }
    with api.client(token) as http:
        created = http.post("/v1/runs", json=body)
        assert created.status_code == 201
        run_id = created.json()["id"]
        assert http.post("/v1/runs", json=body).status_code == 200
        assert http.get(f"/v1/runs/{run_id}").json()["run"]["submitted_by"] == "local"
        assert [r["id"] for r in http.get("/v1/runs").json()["runs"]] == [run_id]
        assert http.get("/v1/runs/4242").json()["error"] == "run_not_found"
    run_transaction(
        sqlite_engine,
        lambda conn: cancel_ops.cancel(conn, run_id, actor="t", reason="r", namespace="e"),
    )
    with sqlite_engine.connect() as conn:
        row = conn.execute(select(callbacks.c.run_id, callbacks.c.url, callbacks.c.payload)).one()
    assert (row.run_id, row.url) == (run_id, "http://127.0.0.1:9/hook")
    assert row.payload["run"]["state"] == RunState.CANCELLED


def test_tls_with_a_certificate(tmp_path: Path, sqlite_url: str) -> None:
    """With --ssl-certfile/--ssl-keyfile the API answers HTTPS (verified against the
    certificate) and nothing in plain HTTP."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    with api_server(
        tmp_path,
        database_url=sqlite_url,
        broker_url="memory://",
        namespace="embedded",
        tls=(cert, key),
    ) as api:
        assert api.base_url.startswith("https://")
        with api.client() as https:
            assert https.get("/healthz").json() == {"status": "ok"}
        with pytest.raises(httpx.TransportError):
            httpx.get(api.base_url.replace("https://", "http://") + "/healthz", timeout=5)


def test_readyz_is_503_while_the_broker_is_unreachable(tmp_path: Path, sqlite_url: str) -> None:
    """/healthz answers (the process is up) while /readyz says the broker cannot be reached."""
    with (
        api_server(
            tmp_path,
            database_url=sqlite_url,
            broker_url="amqp://guest:guest@127.0.0.1:1/%2F",
            namespace="embedded",
        ) as api,
        api.client() as http,
    ):
        assert http.get("/healthz").status_code == 200
        ready = http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["error"] == "broker_unavailable"


def test_a_server_without_a_callback_key_refuses_callback_urls(
    tmp_path: Path, sqlite_url: str, sqlite_engine: Engine
) -> None:
    """No SASFLOW_API_CALLBACK_SECRET: a run asking for a callback is refused (400), since its
    callback could not be signed; runs without one are accepted."""
    token = make_token(sqlite_engine, "local", "submit")
    with (
        api_server(
            tmp_path,
            database_url=sqlite_url,
            broker_url="memory://",
            namespace="embedded",
            env={"SASFLOW_API_CALLBACK_SECRET": None},
        ) as api,
        api.client(token) as http,
    ):
        refused = http.post(
            "/v1/runs", json={"workflow": "pipeline", "callback_url": "http://127.0.0.1:9/h"}
        )
        assert (refused.status_code, refused.json()["error"]) == (400, "callbacks_disabled")
        assert http.post("/v1/runs", json={"workflow": "pipeline"}).status_code == 201
