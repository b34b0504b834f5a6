"""The agent's progress link without a broker: which attempts get a `started`, when, and what
is sent again after a lost connection."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from sasflow.agents.agent import Call
from sasflow.agents.jobs import AgentStats, Job
from sasflow.agents.progress import STARTED_LINGER, ProgressLink
from sasflow.errors import BrokerUnavailableError
from sasflow.messages import Request
from sasflow.transport.base import Delivery, Outgoing
from sasflow.transport.topology import Names


class FakeTransport:
    """Records what is published; `fail` makes the next publish lose the connection."""

    def __init__(self) -> None:
        self.published: list[Outgoing] = []
        self.wakes = 0
        self.fail = False

    def publish_many(self, messages: Sequence[Outgoing]) -> list[Exception | None]:
        if self.fail:
            self.fail = False
            raise BrokerUnavailableError("gone")
        self.published.extend(messages)
        return [None] * len(messages)

    def call_threadsafe(self, _callback: Callable[[], None]) -> None:
        self.wakes += 1


def _job(step_id: int = 7, **fields: Any) -> Job:
    request = Request(
        step_id=step_id,
        run_id=1,
        attempt=2,
        workflow="w",
        step="s",
        agent="svc",
        action="a",
        idempotency_key="k",
        budget_ms=4000,
        complete_by="2026-01-01T00:00:00+00:00",
        **fields,
    )
    call = Call(
        input=None,
        idempotency_key="k",
        attempt=2,
        deadline=time.monotonic() + 100,
        step_id=step_id,
        run_id=1,
        workflow="w",
        step="s",
        action="a",
        kind="forward",
    )
    delivery = Delivery(tag=1, body=b"", queue="q", generation=1, correlation_id=f"{step_id}:2")
    return Job(delivery, request, call)


def _link() -> tuple[ProgressLink, FakeTransport, AgentStats]:
    transport, stats = FakeTransport(), AgentStats()
    link = ProgressLink(transport, Names("t"), "svc", stats)  # type: ignore[arg-type]
    return link, transport, stats


def _sent(transport: FakeTransport) -> list[tuple[str, str, int]]:
    return [
        (m.routing_key, json.loads(m.body)["type"], json.loads(m.body)["step_id"])
        for m in transport.published
    ]


def test_a_request_of_an_older_scheduler_gets_no_progress_and_keeps_its_deadline() -> None:
    link, transport, _ = _link()
    job = _job()
    assert link.start(job) is job.call
    assert not job.begun
    assert link.next_due([job]) is None
    link.flush([job], lambda _job: True)
    assert transport.published == []


def test_the_execution_clock_runs_from_the_take_with_the_whole_budget() -> None:
    link, _, _ = _link()
    job = _job(wait_ms=30000)
    before = time.monotonic()
    call = link.start(job)
    assert before + 4 <= call.deadline <= time.monotonic() + 4
    assert call.cancelled is job.call.cancelled  # the same events: the owner still reaches it
    assert call.beat is None  # no heartbeat clock


def test_started_goes_out_only_for_an_attempt_still_running_after_the_linger() -> None:
    link, transport, stats = _link()
    quick, slow = _job(1, wait_ms=30000), _job(2, wait_ms=30000)
    quick.call, slow.call = link.start(quick), link.start(slow)
    due = link.next_due([quick, slow])
    assert due is not None
    assert due <= time.monotonic() + STARTED_LINGER
    link.flush([quick, slow], lambda _job: True)
    assert transport.published == []  # not due yet
    time.sleep(STARTED_LINGER)
    link.flush([quick, slow], lambda job: job is slow)  # the quick one's reply is ready
    assert _sent(transport) == [("t.replies", "step.started", 2)]
    assert transport.published[0].mandatory
    assert transport.published[0].correlation_id == "2:2"
    assert stats.started == 1
    link.flush([slow], lambda _job: True)  # the quick one is done and gone
    assert len(transport.published) == 1  # once per attempt
    assert link.next_due([slow]) is None


def test_heartbeats_wake_the_owner_and_go_out_at_its_next_pass() -> None:
    link, transport, stats = _link()
    job = _job(wait_ms=30000, heartbeat_ms=600)
    job.call = link.start(job)
    time.sleep(0.2)  # a third of the heartbeat timeout
    job.call.heartbeat()
    job.call.heartbeat()  # rate-limited: not sent
    assert transport.wakes == 1
    link.flush([job], lambda _job: True)
    assert [kind for _, kind, _ in _sent(transport)] == ["step.started", "step.heartbeat"]
    assert (stats.started, stats.heartbeats) == (1, 1)


def test_what_a_lost_connection_did_not_send_is_sent_on_the_next() -> None:
    link, transport, _ = _link()
    job = _job(wait_ms=30000, heartbeat_ms=600)
    job.call = link.start(job)
    time.sleep(max(STARTED_LINGER, 0.2))
    job.call.heartbeat()
    transport.fail = True
    with pytest.raises(BrokerUnavailableError):
        link.flush([job], lambda _job: True)
    assert not job.announced
    link.flush([job], lambda _job: True)
    assert [kind for _, kind, _ in _sent(transport)] == ["step.started", "step.heartbeat"]
