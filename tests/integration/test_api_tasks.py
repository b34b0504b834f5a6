"""REST tasks end to end: callbacks from the outbox (receiver down, then up: each once, signed),
priority jumping a backlog, and agent pools; a real `sasflow api` process, roles in threads."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow.agents.worker import AgentWorker
from sasflow.api.callbacks import CallbackPolicy, CallbackSender
from sasflow.commands import NewRun
from sasflow.messages import DEFAULT_LIMITS
from sasflow.ops import cancel as cancel_ops
from sasflow.ops import submit as submit_ops
from sasflow.states import CallbackState, RunState, StepState
from sasflow.store.db import Connection, run_transaction
from sasflow.store.outbox.alerts import AlertKind
from sasflow.store.runs.pools import PoolLimits
from sasflow.store.schema import alerts, callbacks, events, runs, steps
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.server import SECRET, ApiServer, api_server, free_port, make_token
from tests.apps import basic
from tests.integration.webhook import webhook_server

pytestmark = pytest.mark.integration

FAST_CALLBACKS: dict[str, str | None] = {
    "SASFLOW_API_CALLBACK_BACKOFF_INITIAL_S": "0.2",
    "SASFLOW_API_CALLBACK_BACKOFF_MAX_S": "0.4",
    "SASFLOW_API_CALLBACK_POLL_S": "0.1",
}


@pytest.fixture
def api(tmp_path: Path, database_url: str, broker_url: str, names: Names) -> Iterator[ApiServer]:
    with api_server(
        tmp_path,
        database_url=database_url,
        broker_url=broker_url,
        namespace=names.namespace,
        env=FAST_CALLBACKS,
    ) as server:
        yield server


def _callback_rows(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(callbacks).order_by(callbacks.c.id))]


def test_a_receiver_down_then_up_gets_each_callback_once_signed(
    api: ApiServer, engine: Engine, database_url: str, names: Names
) -> None:
    """Runs end while nobody listens at their callback URL: the callbacks are retried with
    backoff; once the receiver is up it gets each one exactly once, with a valid HMAC-SHA256
    signature and a distinct idempotency key, and the outbox marks them delivered."""
    port = free_port()
    token = make_token(engine, "shop", "submit")
    with api.client(token) as http:
        run_ids = [
            http.post(
                "/v1/runs",
                json={
                    "workflow": "pipeline",
                    "input": {"text": f"t{i}"},
                    "key": f"cb{i}",
                    "callback_url": f"http://127.0.0.1:{port}/hook",
                },
            ).json()["id"]
            for i in range(3)
        ]
    with harness.running(
        harness.scheduler(engine, database_url, basic.registry, names),
        harness.agent(basic.echo, names),
    ):
        harness.wait_for(
            harness.all_runs_in(engine, {RunState.COMPLETED}, 3), what="runs completed"
        )
    harness.wait_for(
        lambda: (
            len(rows := _callback_rows(engine)) == 3 and all(int(r["attempts"]) >= 2 for r in rows)
        ),
        what="callbacks retried while the receiver is down",
    )
    assert {r["state"] for r in _callback_rows(engine)} == {CallbackState.PENDING}
    with webhook_server(port=port) as receiver:
        harness.wait_for(
            lambda: {r["state"] for r in _callback_rows(engine)} == {CallbackState.DELIVERED},
            what="callbacks delivered",
        )
        received = list(receiver.requests)
    assert len(received) == 3
    keys = [headers["Sasflow-Idempotency-Key"] for headers, _ in received]
    assert len(set(keys)) == 3
    assert sorted(keys) == sorted(str(r["idempotency_key"]) for r in _callback_rows(engine))
    for headers, body in received:
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["Sasflow-Signature"], expected)
        assert int(headers["Sasflow-Attempt"]) >= 2
        payload = json.loads(body)
        assert payload["idempotency_key"] == headers["Sasflow-Idempotency-Key"]
        assert payload["run"]["state"] == RunState.COMPLETED
        assert payload["run"]["submitted_by"] == "shop"
    assert sorted(json.loads(b)["run"]["id"] for _, b in received) == sorted(run_ids)


def test_a_callback_is_given_up_at_its_attempt_limit_with_an_alert(engine: Engine) -> None:
    """A receiver that keeps answering 500: after max_attempts the callback is failed and a
    callback_failed alert names the run and the URL."""
    with webhook_server(500, 500, 500) as receiver:
        url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"

        run_id = run_transaction(engine, lambda conn: _ended_run(conn, url))
        _deliver_until_given_up(engine, give_up_s=3600, max_attempts=2)
        assert len(receiver.requests) == 2
    row = _callback_rows(engine)[0]
    assert (row["attempts"], row["last_error"]) == (2, "HTTP 500")
    with engine.connect() as conn:
        alert = conn.execute(select(alerts)).one()
    assert (alert.kind, alert.run_id) == (AlertKind.CALLBACK_FAILED, run_id)
    assert url in alert.message


def test_a_callback_is_given_up_at_its_age_limit(engine: Engine) -> None:
    """A callback older than give_up_s is failed at its first failed attempt past that age."""
    with webhook_server(*[500] * 10) as receiver:
        url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
        run_transaction(engine, lambda conn: _ended_run(conn, url))
        _deliver_until_given_up(engine, give_up_s=0.2, max_attempts=1024)
    row = _callback_rows(engine)[0]
    assert 1 <= row["attempts"] < 1024
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.kind)).scalars().all() == [AlertKind.CALLBACK_FAILED]


def _deliver_until_given_up(engine: Engine, *, give_up_s: float, max_attempts: int) -> None:
    """Run the delivery loop's passes (fast backoff) until the one callback is given up."""
    policy = CallbackPolicy(
        give_up_s=give_up_s,
        max_attempts=max_attempts,
        backoff_initial_s=0.05,
        backoff_max_s=0.05,
        timeout_s=5,
        poll_s=0.05,
    )
    sender = CallbackSender(engine, SECRET.encode(), policy, stop=threading.Event())

    def given_up() -> bool:
        sender.deliver_due()
        return bool(_callback_rows(engine)[0]["state"] == CallbackState.FAILED)

    harness.wait_for(given_up, what="callback given up")


def _ended_run(conn: Connection, url: str) -> int:
    """A run with a callback to `url`, submitted and cancelled (so its callback is due)."""
    new = NewRun(workflow="pipeline", input={}, callback_url=url)
    result = submit_ops.submit_run(
        conn, basic.registry, new, actor="t", namespace="t", limits=DEFAULT_LIMITS
    )
    cancel_ops.cancel(conn, result.run_id, actor="t", reason="r", namespace="t")
    return result.run_id


def test_a_higher_priority_run_jumps_the_backlog(
    api: ApiServer, engine: Engine, database_url: str, names: Names
) -> None:
    """With 12 low-priority runs waiting, 3 submitted later at priority 10 are claimed first
    (one step per claim, so the order of claims is the order of dispatch)."""
    token = make_token(engine, "shop", "submit")
    run = {"workflow": "pipeline", "input": {"text": "x"}}
    with api.client(token) as http:
        low = [
            http.post("/v1/runs", json={**run, "key": f"low{i}"}).json()["id"] for i in range(12)
        ]
        high = [
            http.post("/v1/runs", json={**run, "key": f"high{i}", "priority": 10}).json()["id"]
            for i in range(3)
        ]
    with harness.running(
        harness.scheduler(engine, database_url, basic.registry, names, claim_batch=1),
        harness.agent(basic.echo, names, concurrency=1),
    ):
        harness.wait_for(
            harness.all_runs_in(engine, {RunState.COMPLETED}, 15), what="runs completed"
        )
    with engine.connect() as conn:
        claimed = conn.execute(
            select(events.c.run_id)
            .where(events.c.step == "a", events.c.to_state == StepState.PROCESSING)
            .order_by(events.c.id)
        ).scalars()
        order = list(claimed)
    assert sorted(order[:3]) == sorted(high)
    assert sorted(order[3:]) == sorted(low)


def test_pools_dispatch_to_their_agents_and_fail_a_step_no_agent_serves(
    api: ApiServer, engine: Engine, database_url: str, names: Names
) -> None:
    """A run asking for pool gpu is served by the agent started with pool gpu; a run asking
    for pool cpu, which no agent serves, is never dispatched: its step waits, is looked at on
    each pass and fails with 'no agent in pool cpu' at the look limit."""
    token = make_token(engine, "shop", "submit", "read")
    with api.client(token) as http:
        served = http.post(
            "/v1/runs", json={"workflow": "pipeline", "input": {"text": "x"}, "pool": "gpu"}
        ).json()["id"]
        orphan = http.post("/v1/runs", json={"workflow": "pipeline", "pool": "cpu"}).json()["id"]
        bad = http.post("/v1/runs", json={"workflow": "pipeline", "pool": "no spaces"})
        assert bad.status_code == 422
    gpu_agent = AgentWorker(
        basic.echo, harness.transport("agent-gpu"), names, concurrency=2, pool="gpu"
    )
    try:
        with harness.running(
            harness.scheduler(
                engine,
                database_url,
                basic.registry,
                names,
                rescan_interval=0.05,
                pool_limits=PoolLimits(max_looks=4),
            ),
            gpu_agent,
        ):
            harness.wait_for(
                lambda: (
                    harness.run_states(engine)
                    == {served: RunState.COMPLETED, orphan: RunState.ERROR}
                ),
                what="the gpu run completed and the cpu run failed",
            )
    finally:  # the pool queues `names` does not know of (the session's sweep would find them)
        with services.broker_channel() as channel:
            for pool in ("gpu", "cpu"):
                channel.queue_delete(names.pool("echo", pool))
    assert gpu_agent.stats.received >= 2
    with engine.connect() as conn:
        step = conn.execute(
            select(steps).where(steps.c.run_id == orphan, steps.c.name == "a")
        ).one()
        waits = conn.execute(
            select(events.c.reason).where(
                events.c.run_id == orphan,
                events.c.entity == "step",
                events.c.to_state == StepState.PENDING,
            )
        ).scalars()
        run_error = conn.execute(select(runs.c.error).where(runs.c.id == orphan)).scalar_one()
    assert (step.state, step.pool, step.pool_looks) == (StepState.ERROR, "cpu", 3)
    assert step.error["message"] == "no agent in pool cpu"
    assert list(waits) == ["waiting for an agent in pool cpu"] * 3
    assert "no agent in pool cpu" in json.dumps(run_error)
