"""A request body that does not arrive is not held: a real `sasflow api` process (PostgreSQL,
RabbitMQ) answers `408 request_timeout` once SASFLOW_API_BODY_TIMEOUT_S (2 s here) have passed
and closes the connection, for a body that stops after 10 of 100 declared bytes and for one
that trickles in; a body that arrives within the time is served. Raw sockets: an HTTP client
would not send half a body."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from sasflow.store.db import make_engine
from sasflow.transport.topology import Names
from tests import services
from tests.api.server import ApiServer, api_server, make_token

pytestmark = pytest.mark.integration

BODY_TIMEOUT_S = 2
WAIT_S = 30
"""How long the client waits for an answer: far past the server's timeout."""


@pytest.fixture(scope="module")
def engine(module_database: str) -> Iterator[Engine]:
    engine = make_engine(module_database, application_name="sasflow-test")
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, module_database: str) -> Iterator[ApiServer]:
    names = Names(services.unique("sftest"))
    try:
        with api_server(
            tmp_path_factory.mktemp("api"),
            database_url=module_database,
            broker_url=services.broker_url(),
            namespace=names.namespace,
            env={"SASFLOW_API_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S)},
        ) as server:
            yield server
    finally:
        services.delete_namespace(names.namespace, [])


def _connect(api: ApiServer) -> socket.socket:
    host, port = api.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    return sock


def _head(token: str, length: int) -> bytes:
    return (
        f"POST /v1/runs HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout if it
    keeps it open past WAIT_S)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_a_body_that_stops_halfway_is_answered_408_and_closed(
    api: ApiServer, engine: Engine
) -> None:
    token = make_token(engine, "half-sender", "submit")
    with _connect(api) as sock:
        sock.sendall(_head(token, 100) + b'{"workflo')  # 10 of 100 bytes, then nothing
        answer = _read_to_close(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer
    assert b"connection: close" in head.lower()
    assert body == (
        b'{"error":"request_timeout","message":"the request body did not arrive within '
        + str(BODY_TIMEOUT_S).encode()
        + b' seconds"}'
    )


def test_a_trickling_body_is_cut_at_the_timeout(api: ApiServer, engine: Engine) -> None:
    """A byte now and then does not reset the clock: the limit is on the whole body. Bytes go
    out every 0.25 s until half a second before the timeout, then none (a byte sent into a
    connection the server just closed would make it reset, losing the answer): the 408 comes
    at the timeout, not a timeout after the last byte as an idle timer would answer."""
    token = make_token(engine, "trickler", "submit")
    body = b'{"workflow": "pipeline", "input": {"text": "slow"}}'
    with _connect(api) as sock:
        sock.sendall(_head(token, len(body)))
        started = time.monotonic()
        for byte in body:  # the whole body would take ~13 s
            if time.monotonic() - started > BODY_TIMEOUT_S - 0.5:
                break
            sock.sendall(bytes([byte]))
            time.sleep(0.25)
        answer = _read_to_close(sock)
        answered_after = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    # An idle timer restarted by the last byte would answer at about 2 x BODY_TIMEOUT_S - 0.5.
    assert answered_after < BODY_TIMEOUT_S + 1.0, answered_after


def test_a_body_within_the_time_is_served(api: ApiServer, engine: Engine) -> None:
    token = make_token(engine, "steady", "submit")
    body = b'{"workflow": "pipeline", "input": {"text": "steady"}}'
    with _connect(api) as sock:
        sock.sendall(_head(token, len(body)) + body[:10])
        time.sleep(BODY_TIMEOUT_S / 4)
        sock.sendall(body[10:])
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 201 "), head
    with api.client() as http:  # the server still answers others
        assert http.get("/healthz").status_code == 200
