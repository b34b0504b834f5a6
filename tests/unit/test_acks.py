"""Which requests an agent acknowledges when they start, and which it no longer starts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import cast

from sasflow.agents.acks import ack_taken, acks_at_start, waited_too_long
from sasflow.agents.agent import Call
from sasflow.agents.jobs import AgentStats, Job
from sasflow.errors import BrokerUnavailableError
from sasflow.messages import Request
from sasflow.transport.base import Delivery, Transport


def _job(
    *, budget_s: float, wait_ms: int | None, waited_s: float = 0.0, exclusive: bool = False
) -> Job:
    request = Request(
        step_id=1,
        run_id=1,
        attempt=1,
        workflow="w",
        step="s",
        agent="a",
        action="x",
        input=None,
        idempotency_key="k",
        budget_ms=int(budget_s * 1000),
        complete_by="2026-11-25T10:00:00+00:00",
        wait_ms=wait_ms,
        exclusive=exclusive,
    )
    call = Call(
        input=None,
        idempotency_key="k",
        attempt=1,
        deadline=time.monotonic() + budget_s,
        step_id=1,
        run_id=1,
        workflow="w",
        step="s",
        action="x",
        kind="forward",
    )
    delivery = Delivery(tag=1, body=b"", queue="q", generation=1)
    return Job(delivery, request, call, received=time.monotonic() - waited_s)


def test_steps_of_half_the_consumer_timeout_or_more_are_acknowledged_at_start() -> None:
    assert acks_at_start(_job(budget_s=900, wait_ms=30_000), 1800)
    assert not acks_at_start(_job(budget_s=899, wait_ms=30_000), 1800)


def test_nothing_is_acknowledged_early_without_a_timeout_or_for_an_older_scheduler() -> None:
    assert not acks_at_start(_job(budget_s=7200, wait_ms=30_000), None)
    assert not acks_at_start(_job(budget_s=7200, wait_ms=None), 1800)


def test_a_request_that_waited_here_past_its_wait_budget_is_not_started() -> None:
    assert waited_too_long(_job(budget_s=10, wait_ms=1_000, waited_s=1.5))
    assert not waited_too_long(_job(budget_s=10, wait_ms=1_000, waited_s=0.2))
    assert not waited_too_long(_job(budget_s=10, wait_ms=None, waited_s=100))


class Owner:
    """The transport as a worker thread sees it: callbacks run on the owner's thread."""

    def __init__(self, *, connected: bool = True, reachable: bool = True) -> None:
        self.connected = connected
        self.reachable = reachable
        self.acked: list[int] = []
        self.threads: list[str] = []

    def call_threadsafe(self, callback: Callable[[], None]) -> None:
        if not self.reachable:
            raise BrokerUnavailableError("not connected")
        owner = threading.Thread(target=callback, name="owner")
        owner.start()
        owner.join()

    def ack(self, delivery: Delivery) -> bool:
        self.threads.append(threading.current_thread().name)
        if self.connected:
            self.acked.append(delivery.tag)
        return self.connected


def _taken(owner: Owner, job: Job) -> bool:
    stats = AgentStats()
    return ack_taken(cast(Transport, owner), job, stats) and stats.acked_at_take == 1


def test_an_exclusive_request_is_acknowledged_on_the_owner_thread_before_it_runs() -> None:
    owner = Owner()
    job = _job(budget_s=10, wait_ms=1_000, exclusive=True)
    assert _taken(owner, job)
    assert (owner.acked, owner.threads, job.acked) == ([1], ["owner"], True)


def test_other_requests_run_unacknowledged() -> None:
    owner = Owner()
    assert ack_taken(cast(Transport, owner), _job(budget_s=10, wait_ms=1_000), AgentStats())
    assert owner.acked == []


def test_an_exclusive_request_whose_connection_is_gone_does_not_run_here() -> None:
    for owner in (Owner(connected=False), Owner(reachable=False)):
        job = _job(budget_s=10, wait_ms=1_000, exclusive=True)
        assert not ack_taken(cast(Transport, owner), job, AgentStats())
        assert (owner.acked, job.acked) == ([], False)


def test_an_exclusive_request_acked_past_its_wait_budget_is_not_started() -> None:
    owner = Owner()
    job = _job(budget_s=10, wait_ms=1_000, waited_s=1.5, exclusive=True)
    assert not ack_taken(cast(Transport, owner), job, AgentStats())
    assert owner.acked == [1]  # gone from the broker: the wait clock gives the attempt back
