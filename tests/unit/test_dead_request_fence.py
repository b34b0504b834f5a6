"""What the supervisor makes of dead-lettered requests: whatever names a step and an attempt,
complete request or not (nothing else); a failure of that attempt when an agent rejected it,
the wait clock (no failure) when the broker dropped it before any agent took it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from sasflow.commands import StoredError
from sasflow.messages import Request
from sasflow.supervisor.clocks import Expiry
from sasflow.supervisor.sweep import DeadRequest, _dead_request
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
    assert _dead_request(dead(body, {REASON_HEADER: "Request: for agent 'payments'"})) == (
        _charged(7, 2, "Request: for agent 'payments'")
    )


def test_a_request_the_agent_could_not_parse_still_names_its_attempt() -> None:
    """The agent dead-letters exactly the requests that are not a valid `Request`."""
    body = b'{"step_id": 5, "attempt": "1", "agent": "echo", "broken": true}'
    assert _dead_request(dead(body, {REASON_HEADER: "Request: budget_ms: missing"})) == (
        _charged(5, 1, "Request: budget_ms: missing")
    )


def _charged(step_id: int, attempt: int, reason: str) -> DeadRequest:
    error = StoredError("RequestDeadLettered", reason)
    return DeadRequest(step_id, attempt, Expiry(charged=True, error=error))


def _waited(step_id: int, attempt: int, message: str) -> DeadRequest:
    return DeadRequest(
        step_id, attempt, Expiry(charged=False, error=StoredError("WaitTimeout", message))
    )


def test_a_request_the_broker_expired_is_the_wait_clock_and_counts_no_failure() -> None:
    """x-death `expired`: no agent took it within its wait timeout (its original expiration)."""
    body = b'{"step_id": 5, "attempt": 1}'
    headers = {"x-death": [{"reason": "expired", "original-expiration": "30000"}]}
    assert _dead_request(dead(body, headers)) == _waited(
        5, 1, "wait clock: no agent took the request within 30 s"
    )
    assert _dead_request(dead(body, {"x-death": [{"reason": "expired"}]})) == _waited(
        5, 1, "wait clock: no agent took the request within its wait timeout"
    )
    assert _dead_request(dead(body, {"x-death": [{"reason": "maxlen"}]})) == _waited(
        5, 1, "wait clock: the broker dropped the request before an agent took it (maxlen)"
    )


def test_any_other_broker_reason_counts_a_failure() -> None:
    """Rejected by a consumer (or no reason at all): the attempt failed."""
    body = b'{"step_id": 5, "attempt": 1}'
    assert _dead_request(dead(body, {"x-death": [{"reason": "rejected"}]})) == _charged(
        5, 1, "broker dead-lettered the request (rejected)"
    )
    assert _dead_request(dead(body)) == _charged(5, 1, "broker dead-lettered the request (unknown)")
    assert _dead_request(dead(body, {"x-death": "garbage"})) == _charged(
        5, 1, "broker dead-lettered the request (unknown)"
    )


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
    assert _dead_request(dead(body, {REASON_HEADER: "whatever"})) is None
