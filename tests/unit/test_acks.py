"""Which requests an agent acknowledges when they start, and which it no longer starts."""

from __future__ import annotations

import time

from sasflow.agents.acks import acks_at_start, waited_too_long
from sasflow.agents.agent import Call
from sasflow.agents.jobs import Job
from sasflow.messages import Request
from sasflow.transport.base import Delivery


def _job(*, budget_s: float, wait_ms: int | None, waited_s: float = 0.0) -> Job:
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
