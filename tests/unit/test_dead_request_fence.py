"""Which dead-lettered requests the supervisor counts as a failure of the attempt they name:
whatever names a step and an attempt, complete request or not; nothing else."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from sasflow.messages import Request
from sasflow.supervisor.sweep import _fence_of
from sasflow.transport.base import Delivery
from sasflow.transport.topology import REASON_HEADER


def dead(body: bytes, headers: Mapping[str, Any] | None = None) -> Delivery:
    return Delivery(
        tag=1, body=body, queue="sasflow.dead.requests", generation=1, headers=headers or {}
    )


def test_a_complete_request_names_its_step_and_attempt_with_the_agents_reason() -> None:
    body = Request(
        step_id=7,
        run_id=3,
        attempt=2,
        workflow="order",
        step="charge",
        agent="payments",
        action="charge",
        idempotency_key="7:charge",
        budget_ms=5000,
        complete_by="2025-01-31T12:00:00+00:00",
    ).encode()
    assert _fence_of(dead(body, {REASON_HEADER: "Request: for agent 'payments'"})) == (
        7,
        2,
        "Request: for agent 'payments'",
    )


def test_a_request_the_agent_could_not_parse_still_names_its_attempt() -> None:
    """The agent dead-letters exactly the requests that are not a valid `Request`."""
    body = b'{"step_id": 5, "attempt": "1", "agent": "echo", "broken": true}'
    assert _fence_of(dead(body, {REASON_HEADER: "Request: budget_ms: missing"})) == (
        5,
        1,
        "Request: budget_ms: missing",
    )


def test_without_the_agents_reason_the_brokers_x_death_reason_is_given() -> None:
    body = b'{"step_id": 5, "attempt": 1}'
    assert _fence_of(dead(body, {"x-death": [{"reason": "expired"}]})) == (
        5,
        1,
        "broker dead-lettered the request (expired)",
    )
    assert _fence_of(dead(body)) == (5, 1, "broker dead-lettered the request (unknown)")


@pytest.mark.parametrize(
    "body",
    [
        b"\x00not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'"step_id"',
        b'{"step_id": 5}',
        b'{"attempt": 1}',
        b'{"step_id": "five", "attempt": 1}',
        b'{"step_id": null, "attempt": 1}',
        b'{"step_id": 5, "attempt": {}}',
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=[
        "not-json",
        "not-utf8",
        "a-list",
        "a-string",
        "no-attempt",
        "no-step",
        "step-not-a-number",
        "step-null",
        "attempt-an-object",
        "nested-too-deep",
    ],
)
def test_a_body_that_names_no_attempt_is_not_counted(body: bytes) -> None:
    """Not provably a request of ours: the operator's copy stays in <ns>.dead."""
    assert _fence_of(dead(body, {REASON_HEADER: "whatever"})) is None
