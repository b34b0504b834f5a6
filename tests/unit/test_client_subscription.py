"""The SDK's subscription against a scripted server (httpx.MockTransport): records parsed
whatever the chunking, acknowledgements only for updates whose handler returned, and a
reconnection as the same subscriber after the stream ends."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from sasflow.client import ApiError, Client, StreamUpdate
from sasflow.recordio import encode

SUBSCRIBER = "0b6f2a9e-3c4d-4e5f-8a9b-1c2d3e4f5a6b"
U1, U2, U3 = (f"00000000-0000-4000-8000-00000000000{i}" for i in (1, 2, 3))


class Server:
    """Answers SUBSCRIBE with scripted streams, one per connection, and records the calls."""

    def __init__(self, streams: list[list[dict[str, object]]]) -> None:
        self.streams = streams
        self.subscribes: list[dict[str, object]] = []
        self.acks: list[str] = []
        self.done = threading.Event()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        call = json.loads(request.content)
        if call["type"] == "ACKNOWLEDGE":
            assert request.headers["Sasflow-Stream-Id"] == f"stream-{len(self.subscribes)}"
            self.acks += call["uuids"]
            return httpx.Response(202)
        self.subscribes.append(call)
        if not self.streams:
            self.done.set()
            return httpx.Response(503, json={"error": "unavailable", "message": "bye"})
        records = self.streams.pop(0)
        data = b"".join(encode(r) for r in records)
        # cut into 3-byte pieces: no chunk boundary matches a record boundary
        pieces: Iterator[bytes] = (data[i : i + 3] for i in range(0, len(data), 3))
        return httpx.Response(
            200,
            headers={"Sasflow-Stream-Id": f"stream-{len(self.subscribes)}"},
            stream=_Chunks(pieces),
        )


class _Chunks(httpx.SyncByteStream):
    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces

    def __iter__(self) -> Iterator[bytes]:
        yield from self._pieces


def _subscribed() -> dict[str, object]:
    return {"type": "SUBSCRIBED", "subscriber_id": SUBSCRIBER, "heartbeat_interval_seconds": 1}


def _update(uuid: str | None, run: int, state: str = "pending") -> dict[str, object]:
    record: dict[str, object] = {"type": "UPDATE", "run": run, "state": state, "entity": "run"}
    if uuid is not None:
        record["uuid"] = uuid
    return record


def test_updates_are_acknowledged_after_the_handler_returns_and_the_subscriber_resumes() -> None:
    server = Server(
        [
            [_subscribed(), _update(U1, 1), {"type": "HEARTBEAT"}, _update(U2, 2)],
            [_subscribed(), _update(U2, 2), _update(None, 3, "running"), {"type": "FUTURE"}],
        ]
    )
    seen: list[StreamUpdate] = []
    failed_once: set[str | None] = set()

    def handler(update: StreamUpdate) -> None:
        seen.append(update)
        if update.uuid == U2 and U2 not in failed_once:
            failed_once.add(U2)
            raise RuntimeError("not yet")  # not acknowledged: it comes again

    with Client("http://api", "t", transport=httpx.MockTransport(server)) as client:
        subscription = client.subscription({"workflows": ["order"]}, handler, max_backoff=0.01)
        runner = threading.Thread(target=subscription.run)
        runner.start()
        assert server.done.wait(10)
        subscription.stop()
        runner.join(10)

    assert [(u.uuid, u.run, u.state) for u in seen] == [
        (U1, 1, "pending"),
        (U2, 2, "pending"),
        (U2, 2, "pending"),
        (None, 3, "running"),  # a RECONCILE answer: nothing to acknowledge
    ]
    assert server.acks == [U1, U2]
    assert subscription.connections == 2
    assert subscription.heartbeat_interval == 1
    first, second, *_ = server.subscribes
    assert first == {
        "type": "SUBSCRIBE",
        "subscriber": {"name": "sdk"},
        "filter": {"runs_submitted_by_me": False, "workflows": ["order"]},
    }
    assert second["subscriber"] == {"name": "sdk", "id": SUBSCRIBER}


def test_a_failure_record_goes_to_on_failure_and_is_not_acknowledged() -> None:
    lost: dict[str, object] = {
        "type": "FAILURE",
        "agent": "payments",
        "instance_id": "agent-payments:h:1:ab",
    }
    server = Server([[_subscribed(), lost, _update(U1, 1)]])
    failures: list[dict[str, object]] = []
    seen: list[int] = []

    with Client("http://api", "t", transport=httpx.MockTransport(server)) as client:
        subscription = client.subscription(
            {}, lambda u: seen.append(u.run), max_backoff=0.01, on_failure=failures.append
        )
        runner = threading.Thread(target=subscription.run)
        runner.start()
        assert server.done.wait(10)
        subscription.stop()
        runner.join(10)

    assert failures == [lost]
    assert seen == [1]
    assert server.acks == [U1]


def test_a_refused_subscription_is_an_error_not_a_retry_loop() -> None:
    def refuse(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(403, json={"error": "forbidden", "message": "lacks read"})

    with (
        Client("http://api", "t", transport=httpx.MockTransport(refuse)) as client,
        pytest.raises(ApiError) as raised,
    ):
        client.subscribe({}, lambda _u: None)
    assert (raised.value.status, raised.value.code) == (403, "forbidden")


def test_a_silent_stream_is_dead_after_five_heartbeat_intervals() -> None:
    """A server that announces 0.1 s heartbeats and then falls silent (the connection stays
    open): the SDK gives up on it after about 0.5 s and subscribes again."""
    arrivals: list[float] = []
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)  # the SUBSCRIBE request
            arrivals.append(time.monotonic())
            record = encode(
                {
                    "type": "SUBSCRIBED",
                    "subscriber_id": SUBSCRIBER,
                    "heartbeat_interval_seconds": 0.1,
                }
            )
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nSasflow-Stream-Id: s\r\n\r\n"
                + b"%x\r\n%s\r\n" % (len(record), record)
            )
            threading.Thread(target=lambda c=conn: (stop.wait(30), c.close()), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    port = listener.getsockname()[1]
    try:
        with Client(f"http://127.0.0.1:{port}", "t") as client:
            subscription = client.subscription({}, lambda _u: None, max_backoff=0.01)
            runner = threading.Thread(target=subscription.run, daemon=True)
            runner.start()
            deadline = time.monotonic() + 10
            while len(arrivals) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            subscription.stop()
            stop.set()
            runner.join(10)
    finally:
        listener.close()
    assert len(arrivals) >= 2
    assert 0.4 < arrivals[1] - arrivals[0] < 3.0  # 5 x 0.1 s, then a short backoff
    assert subscription.heartbeat_interval == 0.1
