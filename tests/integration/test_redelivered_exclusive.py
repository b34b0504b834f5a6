"""A redelivered exclusive request (a step under a concurrency limit) runs, if at all, within
its attempt's budget counted from its claim, never with a fresh budget from its redelivery
(sasflow.agents.redelivery). On the real broker: the request is delivered once to a consumer
that closes without acknowledging it, so the agent receives it with the broker's
`redelivered` flag, as after an acknowledgement lost in a broker restart.

Before, the agent ran such a copy with its whole budget from its receipt: the chaos suite's
per-account check saw a charge redelivered 10 s after its attempt started run beside the
account's next charge, which the limit had admitted once the database ended that attempt."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from sasflow.agents import Agent, Call
from sasflow.messages import Request
from sasflow.transport.topology import Names, declare_agent_queue, declare_common
from tests import harness, services

pytestmark = pytest.mark.integration

WAIT_S = 1.0


class Charges:
    """The handler's calls: (step id, seconds left when it started)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []
        self.lock = threading.Lock()
        self.agent = Agent("acct")

        @self.agent.handler("charge")
        def charge(call: Call) -> str:
            with self.lock:
                self.calls.append((call.step_id, call.remaining()))
            return "charged"


def _request(step_id: int, *, claimed_ago: float, budget_s: float) -> bytes:
    """An exclusive request claimed `claimed_ago` seconds ago (this machine's clock stands for
    the database's: the agent has seen no fresh request to learn their offset from)."""
    claimed = datetime.now(UTC) - timedelta(seconds=claimed_ago)
    return Request(
        step_id=step_id,
        run_id=step_id,
        attempt=1,
        workflow="pay",
        step="charge",
        agent="acct",
        action="charge",
        idempotency_key=f"k{step_id}",
        budget_ms=int(budget_s * 1000),
        complete_by=(claimed + timedelta(seconds=WAIT_S + budget_s)).isoformat(),
        wait_ms=int(WAIT_S * 1000),
        exclusive=True,
    ).encode()


def _redelivered(queue: str, body: bytes) -> None:
    """Put `body` in `queue` and have it delivered once, unacknowledged: the broker requeues it
    with its `redelivered` flag when the consumer's connection closes."""
    harness.publish_raw(queue, body)
    with services.broker_channel() as channel:
        method, _, _ = channel.basic_get(queue, auto_ack=False)
        assert method is not None
        assert not method.redelivered


@pytest.fixture
def queue(names: Names) -> str:
    transport = harness.transport("setup")
    transport.connect()
    try:
        declare_common(transport, names)
        declare_agent_queue(transport, names, "acct")
    finally:
        transport.close()
    return names.agent("acct")


def test_a_redelivered_exclusive_request_past_its_claims_budget_is_not_run(
    names: Names, queue: str
) -> None:
    charges = Charges()
    _redelivered(queue, _request(1, claimed_ago=10, budget_s=2))
    harness.publish_raw(queue, _request(2, claimed_ago=0, budget_s=2))  # fresh: it runs
    worker = harness.agent(charges.agent, names, concurrency=1)
    with harness.running(worker):
        harness.wait_for(lambda: worker.stats.replied_ok == 1, what="the fresh request's reply")
        harness.wait_for(
            lambda: services.queue_figure(queue, "messages") == 0, what="the queue emptied"
        )
    assert [step for step, _ in charges.calls] == [2]
    assert worker.stats.redelivered_dropped == 1
    assert services.queue_figure(queue, "messages_unacknowledged") == 0


def test_a_redelivered_exclusive_request_runs_only_for_what_is_left_of_its_budget(
    names: Names, queue: str
) -> None:
    charges = Charges()
    _redelivered(queue, _request(3, claimed_ago=2, budget_s=6))
    worker = harness.agent(charges.agent, names, concurrency=1)
    with harness.running(worker):
        harness.wait_for(lambda: worker.stats.replied_ok == 1, what="the reply")
    ((step, remaining),) = charges.calls
    assert step == 3
    assert 3.0 < remaining <= 4.05, f"{remaining:.3f}s left: not counted from the claim"
    assert worker.stats.redelivered_dropped == 0
