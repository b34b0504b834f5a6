"""An agent's reply is published mandatory: one whose queue is gone comes back, and the agent
neither loses it nor runs the handler again. `<ns>.replies` deleted under a running step is
declared again and the reply lands in it; a `reply_to` queue that is missing is retried, the
request kept, until the queue appears."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sasflow.agents import Agent, Call
from sasflow.agents.worker import AgentWorker
from sasflow.messages import Request
from sasflow.transport.topology import Names
from tests import harness, services

pytestmark = pytest.mark.integration

BUDGET_MS = 30_000


class Gate:
    """A handler that runs until the test opens it, counting its calls."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.opened = threading.Event()
        self.calls = 0
        self.agent = Agent("gated")
        self.agent.handler("pass")(self._handle)

    def _handle(self, call: Call) -> dict[str, Any]:
        self.calls += 1
        self.started.set()
        self.opened.wait(BUDGET_MS / 1000)
        return {"key": call.idempotency_key}


@pytest.fixture
def gate(names: Names) -> Iterator[tuple[Gate, AgentWorker]]:
    gate = Gate()
    worker = harness.agent(gate.agent, names, concurrency=1)
    with harness.running(worker):
        queue = names.agent_queue(gate.agent.name, None)
        harness.wait_for(lambda: _consumers(queue) == 1, what="the agent consumes")
        yield gate, worker
        gate.opened.set()


def _consumers(queue: str) -> int:
    if not services.queue_exists(queue):
        return 0
    with services.broker_channel() as channel:
        return int(channel.queue_declare(queue, passive=True).method.consumer_count or 0)


def _request(names: Names, reply_to: str) -> None:
    request = Request(
        step_id=7,
        run_id=3,
        attempt=1,
        workflow="w",
        step="s",
        agent="gated",
        action="pass",
        input={},
        idempotency_key="idem-7",
        budget_ms=BUDGET_MS,
        complete_by=(datetime.now(UTC) + timedelta(milliseconds=BUDGET_MS)).isoformat(),
    )
    harness.publish_raw(
        names.agent_queue("gated", None),
        request.encode(),
        content_type="application/json",
        correlation_id="7:1",
        reply_to=reply_to,
        expiration=str(BUDGET_MS),
    )


def _take_one(queue: str, timeout: float = 20.0) -> dict[str, Any]:
    found: list[bytes] = []

    def arrived() -> bool:
        if not services.queue_exists(queue):
            return False
        with services.broker_channel() as channel:
            method, _props, body = channel.basic_get(queue, auto_ack=True)
        if method is not None and isinstance(body, bytes):
            found.append(body)
        return bool(found)

    harness.wait_for(arrived, timeout=timeout, what=f"a reply on {queue}")
    reply: dict[str, Any] = json.loads(found[0])
    return reply


def _delete(queue: str) -> None:
    with services.broker_channel() as channel:
        channel.queue_delete(queue)


def test_a_reply_to_a_deleted_replies_queue_lands_in_it_declared_again(
    names: Names, gate: tuple[Gate, AgentWorker]
) -> None:
    handler, worker = gate
    _request(names, names.replies)
    assert handler.started.wait(10)
    _delete(names.replies)  # e.g. an operator's mistake, or a queue lost with its node

    handler.opened.set()
    reply = _take_one(names.replies)

    assert (reply["step_id"], reply["attempt"], reply["status"]) == (7, 1, "ok")
    assert reply["output"] == {"key": "idem-7"}
    assert handler.calls == 1
    harness.wait_for(lambda: worker.stats.replied_ok == 1, what="the reply is counted")
    assert _queued(names.agent_queue("gated", None)) == 0  # the request was acked once


def test_a_reply_to_a_missing_queue_is_kept_and_sent_once_the_queue_exists(
    names: Names, gate: tuple[Gate, AgentWorker]
) -> None:
    """Not one of ours, so the agent cannot declare it: it holds the request unacked and
    publishes again until the queue appears (before the step's deadline)."""
    handler, worker = gate
    elsewhere = f"{names.namespace}.client-replies"
    _request(names, elsewhere)
    assert handler.started.wait(10)
    handler.opened.set()
    harness.wait_for(lambda: worker.stats.replied_ok == 0 and _held(worker), what="held")

    with services.broker_channel() as channel:
        channel.queue_declare(elsewhere, durable=True)
    reply = _take_one(elsewhere)

    assert (reply["step_id"], reply["status"]) == (7, "ok")
    assert handler.calls == 1
    harness.wait_for(lambda: worker.stats.replied_ok == 1, what="the reply is counted")


def _held(worker: AgentWorker) -> bool:
    return worker._replies.retry_at is not None


def _queued(queue: str) -> int:
    with services.broker_channel() as channel:
        declared = channel.queue_declare(queue, passive=True)
    return int(declared.method.message_count or 0)
