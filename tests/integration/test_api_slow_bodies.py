"""A request body that does not arrive is not held: a real `sasflow api` process (PostgreSQL,
RabbitMQ) answers `408 request_timeout` once SASFLOW_API_BODY_TIMEOUT_S (2 s here) have passed
and closes the connection, for a body that stops after 10 of 100 declared bytes and for one
that trickles in; a body that arrives within the time is served. The same for a request's head
(SASFLOW_API_HEADER_TIMEOUT_S, 2 s here): half a head, a head that trickles in, or none on a
new connection is answered 408 and closed; a keep-alive connection idle between requests is not
cut by it. Raw sockets: an HTTP client would not send half a body or half a head."""

from __future__ import annotations

import socket
import time

import pytest
from sqlalchemy import Engine

from tests.api.server import ApiServer, make_token, module_api_fixture

pytestmark = pytest.mark.integration

BODY_TIMEOUT_S = 2
HEAD_TIMEOUT_S = 2
WAIT_S = 30
"""How long the client waits for an answer: far past the server's timeout."""


api = module_api_fixture(
    env={
        "SASFLOW_API_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "SASFLOW_API_HEADER_TIMEOUT_S": str(HEAD_TIMEOUT_S),
    }
)


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


def _trickle(sock: socket.socket, data: bytes, timeout_s: float) -> tuple[bytes, float]:
    """Send `data` a byte every 0.25 s until half a second before `timeout_s` (a byte sent into
    a connection the server just closed would make it reset, losing the answer), then read
    to the close: (the answer, seconds from the first byte to the close)."""
    started = time.monotonic()
    for byte in data:
        if time.monotonic() - started > timeout_s - 0.5:
            break
        sock.sendall(bytes([byte]))
        time.sleep(0.25)
    answer = _read_to_close(sock)
    return answer, time.monotonic() - started


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (head and its Content-Length of body), the connection left open."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return received


def test_a_body_that_stops_halfway_is_answered_408_and_closed(
    api: ApiServer, module_engine: Engine
) -> None:
    token = make_token(module_engine, "half-sender", "submit")
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


def test_a_trickling_body_is_cut_at_the_timeout(api: ApiServer, module_engine: Engine) -> None:
    """A byte now and then does not reset the clock: the limit is on the whole body. Bytes go
    out every 0.25 s until half a second before the timeout, then none (a byte sent into a
    connection the server just closed would make it reset, losing the answer): the 408 comes
    at the timeout, not a timeout after the last byte as an idle timer would answer."""
    token = make_token(module_engine, "trickler", "submit")
    body = b'{"workflow": "pipeline", "input": {"text": "slow"}}'
    with _connect(api) as sock:
        sock.sendall(_head(token, len(body)))
        answer, answered_after = _trickle(sock, body, BODY_TIMEOUT_S)  # all of it: ~13 s
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    # An idle timer restarted by the last byte would answer at about 2 x BODY_TIMEOUT_S - 0.5.
    assert answered_after < BODY_TIMEOUT_S + 1.0, answered_after


def test_a_body_within_the_time_is_served(api: ApiServer, module_engine: Engine) -> None:
    token = make_token(module_engine, "steady", "submit")
    body = b'{"workflow": "pipeline", "input": {"text": "steady"}}'
    with _connect(api) as sock:
        sock.sendall(_head(token, len(body)) + body[:10])
        time.sleep(BODY_TIMEOUT_S / 4)
        sock.sendall(body[10:])
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 201 "), head
    with api.client() as http:  # the server still answers others
        assert http.get("/healthz").status_code == 200


HEAD_408 = (
    b'{"error":"request_timeout","message":"the request head did not arrive within '
    + str(HEAD_TIMEOUT_S).encode()
    + b' seconds"}'
)


@pytest.mark.parametrize(
    "sent", [b"GET /v1/runs HTTP/1.1\r\nHost: x\r\n", b""], ids=["half-a-head", "nothing"]
)
def test_a_head_that_does_not_arrive_is_answered_408_and_closed(
    api: ApiServer, sent: bytes
) -> None:
    """Half a request head and then nothing (or no byte at all on a new connection): the
    server answers 408 and closes the connection at the head's timeout, not WAIT_S later."""
    with _connect(api) as sock:
        sock.sendall(sent)
        started = time.monotonic()
        answer = _read_to_close(sock)
        answered_after = time.monotonic() - started
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer
    assert b"connection: close" in head.lower()
    assert body == HEAD_408
    assert answered_after < HEAD_TIMEOUT_S + 1.0, answered_after


def test_a_slow_head_within_the_time_and_an_idle_keep_alive_are_served(
    api: ApiServer,
) -> None:
    """A head sent in two parts within the time is served; the connection then idles past the
    head's timeout (shorter than uvicorn's keep-alive of 5 s) and still serves the next
    request: the head's clock starts with a request's first byte, not between requests."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with _connect(api) as sock:
        sock.sendall(request[:20])
        time.sleep(HEAD_TIMEOUT_S / 4)
        sock.sendall(request[20:])
        first = _read_response(sock)
        time.sleep(HEAD_TIMEOUT_S + 0.5)  # to show that nothing happens meanwhile
        sock.sendall(request)
        second = _read_response(sock)
    assert first.startswith(b"HTTP/1.1 200 "), first
    assert second.startswith(b"HTTP/1.1 200 "), second


def test_a_trickling_head_is_cut_at_the_timeout(api: ApiServer) -> None:
    """A byte of the head every 0.25 s does not restart the head's clock: the 408 comes at the
    timeout from the first byte (bytes stop half a second before it, as for the body)."""
    head = b"GET /v1/runs HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 100
    with _connect(api) as sock:
        answer, answered_after = _trickle(sock, head, HEAD_TIMEOUT_S)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert answered_after < HEAD_TIMEOUT_S + 1.0, answered_after
