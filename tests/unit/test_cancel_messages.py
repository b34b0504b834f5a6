"""The `Cancel` message (docs/protocol.md): validated like the others; made by the relay only
from the event of a step cancelled in flight; acted on by an agent only for the attempt it runs
(sasflow.agents.cancels)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest

from sasflow.agents.cancels import Cancels
from sasflow.agents.children import ChildProcesses
from sasflow.agents.jobs import AgentStats, Job
from sasflow.errors import InvalidMessageError
from sasflow.messages import Cancel, Request, parse
from sasflow.relay import _cancel
from sasflow.transport.base import Delivery, Transport
from sasflow.transport.topology import Names

VALID = {"v": 1, "step_id": 7, "run_id": 3, "attempt": 2, "agent": "payments", "reason": "r"}


def _body(**changes: Any) -> bytes:
    return json.dumps({**VALID, **changes}).encode()


def test_a_valid_cancel_parses_and_round_trips() -> None:
    cancel = parse(Cancel, _body(event_id=11))
    assert (cancel.step_id, cancel.run_id, cancel.attempt, cancel.agent, cancel.event_id) == (
        7,
        3,
        2,
        "payments",
        11,
    )
    assert parse(Cancel, cancel.encode()) == cancel


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("step_id", 0),
        ("attempt", 0),
        ("attempt", "two"),
        ("run_id", None),
        ("agent", "no spaces"),
        ("agent", ""),
        ("v", 2),
        ("reason", "x" * 4001),
    ],
)
def test_a_bad_field_makes_the_cancel_invalid_and_is_named(field: str, value: Any) -> None:
    with pytest.raises(InvalidMessageError, match=field):
        parse(Cancel, _body(**{field: value}))


def test_a_cancel_without_its_attempt_is_invalid() -> None:
    body = {k: v for k, v in VALID.items() if k != "attempt"}
    with pytest.raises(InvalidMessageError, match="attempt"):
        parse(Cancel, json.dumps(body).encode())


def _row(**changes: Any) -> SimpleNamespace:
    row = {
        "id": 40,
        "run_id": 3,
        "step_id": 7,
        "entity": "step",
        "from_state": "processing",
        "to_state": "cancelled",
        "attempt": 2,
        "detail": {"agent": "payments"},
        "reason": "cancelled: customer asked",
    }
    return SimpleNamespace(**{**row, **changes})


def test_the_relay_makes_a_cancel_of_a_step_cancelled_in_flight() -> None:
    assert _cancel(_row()) == Cancel(
        step_id=7,
        run_id=3,
        attempt=2,
        agent="payments",
        reason="cancelled: customer asked",
        event_id=40,
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"from_state": "pending"},  # never sent to an agent
        {"to_state": "processed"},
        {"entity": "run"},
        {"attempt": None},
        {"detail": None},  # recorded by an older version: no agent named
        {"detail": {"agent": "bad name"}},  # invalid: left out, the status event still goes out
    ],
)
def test_the_relay_makes_no_cancel_of_other_events(changes: dict[str, Any]) -> None:
    assert _cancel(_row(**changes)) is None


def _job(step_id: int, attempt: int) -> Job:
    request = Request(
        step_id=step_id,
        run_id=3,
        attempt=attempt,
        workflow="w",
        step="s",
        agent="payments",
        action="charge",
        idempotency_key="k",
        budget_ms=1000,
        complete_by=datetime.now(UTC).isoformat(),
    )
    delivery = Delivery(tag=1, body=b"", queue="q", generation=1)
    return Job.received_at(0.0, delivery, request, ChildProcesses())


class _Acks:
    """The one transport method `Cancels` uses besides consuming: ack."""

    def __init__(self) -> None:
        self.acked: list[int] = []

    def ack(self, delivery: Delivery) -> bool:
        self.acked.append(delivery.tag)
        return True


def _cancels(jobs: dict[tuple[int, int], Job], remembered: int = 100) -> tuple[Cancels, _Acks]:
    acks = _Acks()
    cancels = Cancels(
        "agent-payments:host:1",
        "payments",
        cast(Transport, acks),
        names=Names("t"),
        jobs=jobs,
        stats=AgentStats(),
        dead_letter=lambda _delivery, _reason: None,
        remembered=remembered,
    )
    return cancels, acks


def test_a_cancel_stops_only_the_attempt_it_names() -> None:
    running = _job(7, 2)
    cancels, _ = _cancels({(7, 2): running})
    assert cancels.received(parse(Cancel, _body(attempt=1))) is None  # stale
    assert not running.call.cancelled.is_set()
    assert not running.revoked
    assert cancels.received(parse(Cancel, _body())) is running
    assert (running.revoked, running.call.cancelled.is_set(), running.call.aborted.is_set()) == (
        True,
        True,
        True,
    )
    assert cancels.received(parse(Cancel, _body())) is None  # a duplicate: acted on once


def test_a_cancelled_attempt_is_remembered_so_its_late_request_is_not_run() -> None:
    cancels, acks = _cancels({}, remembered=2)
    for step_id in (1, 2, 3):
        cancels.received(parse(Cancel, _body(step_id=step_id)))
    assert [cancels.cancelled(s, 2) for s in (1, 2, 3)] == [False, True, True]
    late = _job(3, 2)
    assert cancels.came_first(late.request, late.delivery)
    assert acks.acked == [late.delivery.tag]
    other = _job(3, 1)
    assert not cancels.came_first(other.request, other.delivery)
