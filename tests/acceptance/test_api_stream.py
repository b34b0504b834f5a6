"""The subscription stream end to end: real `sasflow api` processes on PostgreSQL (and one on
the embedded SQLite default), the SDK and raw HTTP as clients, the relay fanning events out.

What is counted: a subscriber receives every UPDATE it had not acknowledged and none it had,
across its own death, an API server's kill -9, a second server behind the same port, and a
proxy that re-chunks the stream at random boundaries."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select

from sasflow.client import ApiError, Client, StreamUpdate
from sasflow.recordio import Decoder
from sasflow.store.db import make_engine
from sasflow.store.migrate import upgrade
from sasflow.store.schema import stream_updates, subscribers
from sasflow.transport.topology import Names
from tests.acceptance.conftest import FAST_STREAM, Serve
from tests.api.server import api_server, make_token
from tests.proxy import Proxy
from tests.stream_feed import Feed, feeding

pytestmark = [pytest.mark.acceptance, pytest.mark.slow, pytest.mark.timeout(90)]

STREAM = "Sasflow-Stream-Id"


@pytest.fixture
def feed(engine: Engine, names: Names) -> Iterator[Feed]:
    with feeding(engine, names) as feed:
        yield feed


def wait_until(check: Callable[[], bool], timeout: float = 20, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def pending_updates(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(stream_updates)).scalar_one())


class Recorder:
    """An SDK handler that records what it received, and (through the SDK's transport) what
    the server accepted as acknowledged, in one ordered log."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str | None, int]] = []
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()

    def handler(self, update: StreamUpdate) -> None:
        if not self.gate.is_set():
            self.waiting.set()
            self.gate.wait(30)
        with self.lock:
            self.log.append(("recv", update.uuid, update.run))

    def transport(self) -> httpx.HTTPTransport:
        recorder = self

        class Recording(httpx.HTTPTransport):
            def handle_request(self, request: httpx.Request) -> httpx.Response:
                response = super().handle_request(request)
                if request.content:
                    call = json.loads(request.content)
                    if call.get("type") == "ACKNOWLEDGE" and response.status_code == 202:
                        with recorder.lock:
                            recorder.log += [("ack", u, 0) for u in call["uuids"]]
                return response

        return Recording()

    def received(self) -> list[tuple[str | None, int]]:
        with self.lock:
            return [(u, run) for kind, u, run in self.log if kind == "recv"]

    def acked(self) -> set[str | None]:
        with self.lock:
            return {u for kind, u, _ in self.log if kind == "ack"}

    def received_after_ack(self) -> list[str | None]:
        with self.lock:
            acked: set[str | None] = set()
            late = []
            for kind, u, _ in self.log:
                if kind == "ack":
                    acked.add(u)
                elif u in acked:
                    late.append(u)
            return late


def follow(client: Client, recorder: Recorder, subscriber_id: str | None = None) -> Any:
    subscription = client.subscription(
        {}, recorder.handler, name="test", subscriber_id=subscriber_id, max_backoff=0.5
    )
    thread = threading.Thread(target=subscription.run, name="subscription", daemon=True)
    thread.start()
    return subscription, thread


def raw_records(response: httpx.Response) -> Iterator[dict[str, Any]]:
    decoder = Decoder()
    for chunk in response.iter_bytes():
        yield from decoder.feed(chunk)


def test_a_killed_subscriber_gets_exactly_its_unacknowledged_updates_back(
    serve: Serve, engine: Engine, feed: Feed
) -> None:
    """A raw client reads 20 updates, acknowledges 8 and dies; 5 more runs happen meanwhile.
    Reconnected through a proxy that re-chunks every response at random boundaries, the SDK
    receives the 12 + 5 others, once each, and none of the 8."""
    server = serve("api")
    port = int(server.base_url.rsplit(":", 1)[1])
    secret = make_token(engine, "alice", "read")
    auth = {"Authorization": f"Bearer {secret}"}
    url = f"{server.base_url}/v1/stream"
    body = {"type": "SUBSCRIBE", "subscriber": {"name": "raw"}}
    updates: list[dict[str, Any]] = []
    with httpx.Client(timeout=10) as http, http.stream("POST", url, json=body, headers=auth) as r:
        assert r.status_code == 200
        assert r.headers["transfer-encoding"] == "chunked"
        stream_id = r.headers[STREAM]
        records = raw_records(r)
        subscribed = next(records)
        assert subscribed["type"] == "SUBSCRIBED"
        assert subscribed["heartbeat_interval_seconds"] == 0.5
        first = feed.runs(20)
        for record in records:
            if record["type"] == "UPDATE":
                updates.append(record)
            if len(updates) == 20:
                break
        for update in updates[:8]:
            call = {"type": "ACKNOWLEDGE", "uuid": update["uuid"]}
            assert (
                httpx.post(url, json=call, headers={**auth, STREAM: stream_id}).status_code == 202
            )
    # the connection is gone without a goodbye, as when the process is killed
    assert [u["run"] for u in updates] == first  # commit order
    later = feed.runs(5)

    recorder = Recorder()
    with (
        Proxy(port, rechunk=True) as proxy,
        Client(f"http://127.0.0.1:{proxy.port}", secret) as client,
    ):
        subscription, thread = follow(client, recorder, subscribed["subscriber_id"])
        wait_until(lambda: len(recorder.received()) >= 17, what="17 updates")
        wait_until(lambda: pending_updates(engine) == 0, what="every update acknowledged")
        time.sleep(1.0)  # two heartbeats: time for any extra update to show
        subscription.stop()
        thread.join(10)
        chunks = proxy.chunks

    received = recorder.received()
    assert len(received) == 17
    assert {u for u, _ in received} == {u["uuid"] for u in updates[8:]} | {
        u for u, run in received if run in later
    }
    assert [run for _, run in received] == first[8:] + later
    assert not {u["uuid"] for u in updates[:8]} & {u for u, _ in received}
    assert chunks > 3 * len(received)  # the proxy did cut the records up
    assert not thread.is_alive()


def test_an_api_server_killed_mid_stream_and_a_second_one_behind_the_same_port(
    serve: Serve, engine: Engine, feed: Feed
) -> None:
    """Two API servers behind one port serve one subscriber in turn: the first is killed -9
    while the handler holds an update; through the second, the subscriber gets every update
    it had not acknowledged (the held one and those queued meanwhile), none it had."""
    api_a, api_b = serve("api-a"), serve("api-b")
    port_a, port_b = (int(s.base_url.rsplit(":", 1)[1]) for s in (api_a, api_b))
    secret = make_token(engine, "bob", "read")
    recorder = Recorder()
    with (
        Proxy(port_a) as proxy,
        Client(f"http://127.0.0.1:{proxy.port}", secret, transport=recorder.transport()) as client,
    ):
        subscription, thread = follow(client, recorder)
        wait_until(lambda: subscription.connections == 1, what="the first stream")
        batch = feed.runs(10)
        wait_until(lambda: len(recorder.acked()) == 10, what="10 acknowledged")

        recorder.gate.clear()  # the next update is held in the handler
        batch += feed.runs(5)
        assert recorder.waiting.wait(10)
        api_a.process.send_signal(signal.SIGKILL)
        api_a.process.wait(10)
        proxy.backend = port_b
        batch += feed.runs(5)  # while the subscriber has no stream
        recorder.gate.set()

        wait_until(lambda: subscription.connections == 2, what="the stream through api-b")
        wait_until(lambda: pending_updates(engine) == 0, what="every update acknowledged")
        time.sleep(1.0)
        subscription.stop()
        thread.join(10)

    received = recorder.received()
    assert {run for _, run in received} == set(batch)
    assert recorder.received_after_ack() == []  # none it had acknowledged came again
    assert len(recorder.acked()) == 20
    # Re-sent: what api-a had sent but not seen acknowledged when it died (at most the 5 of
    # the held batch: the held one's ACK reached api-b, which accepts it, the stream still
    # being the subscriber's current one in the database).
    assert 20 <= len(received) <= 25
    assert not thread.is_alive()
    assert "POST /v1/stream" in api_b.log_text()


def test_calls_on_the_stream_and_their_refusals(serve: Serve, engine: Engine, feed: Feed) -> None:
    """403 without a current stream id (missing, unknown, replaced, another token's), 400
    for a malformed call, 202 for ACKNOWLEDGE, RECONCILE, KILL and TEARDOWN; on the same
    server, the SDK's REST methods; then SIGTERM ends the open streams with ERROR."""
    server = serve("api")
    base = server.base_url
    carol = {"Authorization": f"Bearer {make_token(engine, 'carol', 'read', 'submit')}"}
    dave = {"Authorization": f"Bearer {make_token(engine, 'dave', 'read')}"}
    submit_only = {"Authorization": f"Bearer {make_token(engine, 'erin', 'submit')}"}
    url = f"{base}/v1/stream"
    subscribe = {
        "type": "SUBSCRIBE",
        "subscriber": {"name": "carol-ctl"},
        "filter": {"runs_submitted_by_me": True},
    }
    assert httpx.post(url, json=subscribe).status_code == 401
    typo = {**subscribe, "filter": {"workflows": ["pipline"]}}
    answer = httpx.post(url, json=typo, headers=carol)
    assert answer.status_code == 400
    assert "unknown pipline; known: diamond" in answer.json()["message"]
    refused = httpx.post(url, json=subscribe, headers=submit_only)
    assert (refused.status_code, refused.json()["error"]) == (403, "forbidden")

    with httpx.Client(timeout=10) as http:
        mine = http.post(
            f"{base}/v1/runs", json={"workflow": "pipeline", "input": {"text": "a"}}, headers=carol
        )
        assert mine.status_code == 201, mine.text
        run = mine.json()["id"]
        other = feed.runs(1)[0]  # not carol's: filtered out, and not hers to kill
        with http.stream("POST", url, json=subscribe, headers=carol) as stream:
            stream_id = stream.headers[STREAM]
            records = raw_records(stream)
            subscriber_id = next(records)["subscriber_id"]
            on = {**carol, STREAM: stream_id}

            def call(body: Any, headers: dict[str, str] = on) -> httpx.Response:
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                return http.post(url, content=content, headers=headers)

            ack = {"type": "ACKNOWLEDGE", "uuid": "00000000-0000-4000-8000-000000000000"}
            assert call(ack).status_code == 202  # nothing pending under that uuid: harmless
            assert call(ack, carol).json()["error"] == "stale_stream"
            assert call(ack, carol).status_code == 403
            assert (
                call(ack, {**carol, STREAM: "00000000-0000-4000-8000-000000000000"}).status_code
                == 403
            )
            assert call(ack, {**dave, STREAM: stream_id}).status_code == 403
            for malformed in (
                b"{not json",
                b"[1]",
                {"type": "DANCE"},
                {"type": "ACKNOWLEDGE"},
                {"type": "ACKNOWLEDGE", "uuid": "x"},
                {"type": "KILL", "run": "seven"},
                {"type": "RECONCILE", "runs": [1], "extra": 1},
            ):
                answer = call(malformed)
                assert answer.status_code == 400, (malformed, answer.text)
                assert set(answer.json()) >= {"error", "message"}

            assert call({"type": "RECONCILE", "runs": []}).status_code == 202
            assert call({"type": "KILL", "run": other}).status_code == 404
            assert call({"type": "KILL", "run": run}).status_code == 202
            feed.relay()  # the cancellation's events
            seen = []
            for record in records:
                if record["type"] == "UPDATE":
                    seen.append((record.get("uuid") is None, record["run"], record["state"]))
                if len(seen) == 2:
                    break
            # Her run was submitted (and relayed) before she subscribed: RECONCILE tells its
            # state, without uuid; the KILL's cancellation comes as an update to acknowledge.
            assert seen == [(True, run, "pending"), (False, run, "cancelled")]

            # A second stream for the subscriber ends this one, and takes over its calls.
            again = {**subscribe, "subscriber": {"name": "carol-ctl", "id": subscriber_id}}
            with http.stream("POST", url, json=again, headers=carol) as second:
                rest = list(records)  # then the end of the response
                assert rest[-1]["type"] == "ERROR"
                assert {(r["type"], r["run"], r["state"]) for r in rest[:-1]} <= {
                    ("UPDATE", run, "cancelled")  # its steps' cancellations
                }
                assert call(ack).status_code == 403
                on_second = {**carol, STREAM: second.headers[STREAM]}
                assert call({"type": "TEARDOWN"}, on_second).status_code == 202
                assert [r["type"] for r in raw_records(second)][-1] == "ERROR"
        gone = http.post(url, json=again, headers=carol)
        assert (gone.status_code, gone.json()["error"]) == (404, "subscriber_not_found")
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(subscribers)).scalar_one() == 0

    check_the_sdk_rest_methods(base, engine)

    # SIGTERM: open streams are told (ERROR) and ended, so the server stops at once.
    with (
        httpx.Client(timeout=10) as http,
        http.stream("POST", url, json=subscribe, headers=carol) as r,
    ):
        records = raw_records(r)
        assert next(records)["type"] == "SUBSCRIBED"
        server.process.terminate()
        last = list(records)[-1]
    assert last == {"type": "ERROR", "message": "the API server is shutting down: reconnect"}
    server.process.wait(5)  # ended within 5 s (uvicorn re-raises SIGTERM once shut down)


def check_the_sdk_rest_methods(base: str, engine: Engine) -> None:
    """The SDK's REST side on the same server: submit (idempotent), get, list across pages,
    cancel, resubmit, alerts, and errors as ApiError."""
    secret = make_token(engine, "gina", "submit", "read", "operate")
    with Client(base, secret) as api:
        made = api.submit("diamond", {"text": "a"}, key="k-1", priority=5)
        assert made["created"] is True
        again = api.submit("diamond", {"text": "other"}, key="k-1")
        assert (again["created"], again["id"]) == (False, made["id"])
        runs = [made["id"], *(api.submit("diamond", {"text": str(i)})["id"] for i in range(4))]

        shown = api.get(made["id"])
        assert (shown["run"]["id"], shown["run"]["priority"]) == (made["id"], 5)
        assert [r["id"] for r in api.list(workflow="diamond", limit=2)] == sorted(
            runs, reverse=True
        )  # three pages
        assert [r["id"] for r in api.list(state=["pending"], key="k-1")] == [made["id"]]

        assert api.cancel(made["id"], "changed my mind")["state"] == "cancelled"
        assert api.resubmit(made["id"], "try again")["id"] == made["id"]
        assert api.get(made["id"])["run"]["state"] in {"pending", "running"}  # again
        assert api.alerts() == []  # none raised in this test

        with pytest.raises(ApiError) as missing:
            api.get(10**9)
        assert (missing.value.status, missing.value.code) == (404, "run_not_found")
        with pytest.raises(ApiError) as unknown:
            api.submit("nope", {})
        assert unknown.value.status == 404
        assert "pipeline" in unknown.value.message


def test_the_stream_on_the_embedded_default(tmp_path: Path, names: Names) -> None:
    """On SQLite (polling instead of NOTIFY): a handler that fails leaves its update
    unacknowledged, and a reconnection brings exactly those back."""
    url = f"sqlite:///{tmp_path / 'sasflow.db'}"
    engine = make_engine(url, application_name="test")
    try:
        upgrade(engine)
        with (
            feeding(engine, names) as sqlite_feed,
            api_server(
                tmp_path,
                database_url=url,
                broker_url="memory://",
                namespace=names.namespace,
                env=FAST_STREAM,
            ) as server,
        ):
            secret = make_token(engine, "frank", "read")
            failing: set[int] = set()
            recorder = Recorder()

            def handler(update: StreamUpdate) -> None:
                recorder.handler(update)
                if update.run in failing:
                    raise RuntimeError("not now")

            with Client(server.base_url, secret) as client:
                first = client.subscription({"workflows": ["pipeline"]}, handler, name="lite")
                thread = threading.Thread(target=first.run, daemon=True)
                thread.start()
                wait_until(lambda: first.connections == 1, what="the stream")
                runs = sqlite_feed.runs(6)
                sqlite_feed.runs(2, workflow="diamond")  # filtered out
                failing.update(runs[::2])
                wait_until(lambda: len(recorder.received()) == 6, what="6 updates")
                wait_until(lambda: pending_updates(engine) == 3, what="3 acknowledged")
                first.stop()
                thread.join(10)

                again = Recorder()
                second = client.subscription(
                    {"workflows": ["pipeline"]},
                    again.handler,
                    name="lite",
                    subscriber_id=first.subscriber_id,
                )
                thread = threading.Thread(target=second.run, daemon=True)
                thread.start()
                wait_until(lambda: pending_updates(engine) == 0, what="the rest acknowledged")
                time.sleep(1.0)
                second.stop()
                thread.join(10)
            assert sorted(run for _, run in again.received()) == runs[::2]
    finally:
        engine.dispose()
