"""The three clocks without I/O: the policy's validation, the progress messages on the replies
queue, the clock the supervisor blames for an expiry, the agent's heartbeat rate limit, and the
validation of run deadlines."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sasflow import Step, StepPolicy, Workflow
from sasflow.agents import Call
from sasflow.agents.progress import Beat
from sasflow.commands import StepProgress, StoredError
from sasflow.errors import DefinitionError, InvalidMessageError
from sasflow.messages import Progress, Reply, Request, Unknown, parse, parse_on_replies
from sasflow.states import OnDeadline, ReplyStatus
from sasflow.supervisor import clocks

# -- the policy -------------------------------------------------------------------------------


def test_the_clock_defaults_are_the_documented_ones() -> None:
    """30 s to be taken by an agent, then 30 s to execute; no heartbeat needed."""
    policy = StepPolicy()
    assert (policy.wait_timeout, policy.timeout, policy.heartbeat_timeout) == (30.0, 30.0, None)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"wait_timeout": 0}, r"wait_timeout must be > 0, got 0"),
        ({"wait_timeout": -1.5}, r"wait_timeout must be > 0, got -1.5"),
        ({"wait_timeout": float("inf")}, r"wait_timeout must be > 0, got inf"),
        ({"heartbeat_timeout": 0}, r"heartbeat_timeout must be > 0, got 0"),
        ({"heartbeat_timeout": float("nan")}, r"heartbeat_timeout must be > 0, got nan"),
        (
            {"timeout": 10, "heartbeat_timeout": 11},
            r"heartbeat_timeout \(11\) must be <= timeout \(10\): the timeout caps an attempt",
        ),
    ],
)
def test_invalid_clock_settings_are_definition_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        StepPolicy(**fields)


def test_a_heartbeat_timeout_up_to_the_timeout_is_accepted() -> None:
    assert StepPolicy(timeout=60, heartbeat_timeout=1).heartbeat_timeout == 1
    assert StepPolicy(timeout=5, heartbeat_timeout=5).heartbeat_timeout == 5


def test_replace_revalidates_the_clocks() -> None:
    with pytest.raises(DefinitionError, match="wait_timeout"):
        dataclasses.replace(StepPolicy(), wait_timeout=0)


# -- messages ---------------------------------------------------------------------------------

REQUEST: dict[str, Any] = {
    "step_id": 7,
    "run_id": 3,
    "attempt": 2,
    "workflow": "order",
    "step": "pay",
    "agent": "billing",
    "action": "charge",
    "idempotency_key": "k",
    "budget_ms": 5000,
    "complete_by": "2024-01-01T00:00:05+00:00",
}


def test_a_request_carries_its_wait_and_heartbeat_clocks_when_present() -> None:
    fields = {**REQUEST, "wait_ms": 30000, "heartbeat_ms": 1000}
    request = parse(Request, json.dumps(fields).encode())
    assert (request.wait_ms, request.heartbeat_ms) == (30000, 1000)


def test_a_request_of_an_older_scheduler_has_no_clocks() -> None:
    """Absent `wait_ms`: the agent sends no progress and times the budget from receipt."""
    request = parse(Request, json.dumps(REQUEST).encode())
    assert (request.wait_ms, request.heartbeat_ms) == (None, None)


@pytest.mark.parametrize(("field", "value"), [("wait_ms", -1), ("heartbeat_ms", 0)])
def test_bad_clock_fields_in_a_request_are_named(field: str, value: int) -> None:
    with pytest.raises(InvalidMessageError, match=f"Request: {field}:"):
        parse(Request, json.dumps({**REQUEST, field: value}).encode())


def test_progress_messages_parse_on_the_replies_queue_and_say_what_the_store_records() -> None:
    started = parse_on_replies(
        b'{"v":1,"type":"step.started","step_id":17,"attempt":2,"agent":"payments"}'
    )
    beat = parse_on_replies(b'{"type":"step.heartbeat","step_id":17,"attempt":2}')
    assert isinstance(started, Progress)
    assert isinstance(beat, Progress)
    assert started.progress() == StepProgress(17, 2, started=True, agent="payments")
    assert beat.progress() == StepProgress(17, 2, started=False, agent=None)


def test_a_reply_is_still_a_reply_on_the_replies_queue() -> None:
    body = b'{"step_id":17,"attempt":2,"status":"ok","output":{"x":1}}'
    reply = parse_on_replies(body)
    assert reply == parse(Reply, body)
    assert isinstance(reply, Reply)
    assert reply.status is ReplyStatus.OK


def test_a_step_message_this_version_does_not_know_is_recognised_not_refused() -> None:
    """A newer agent's message: the scheduler acks and ignores it, never dead-letters it."""
    assert parse_on_replies(b'{"type":"step.paused","step_id":1,"attempt":1}') == Unknown(
        type="step.paused"
    )


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"type":"step.started","step_id":17}', "Progress: attempt: Field required"),
        (b'{"type":"step.started","step_id":0,"attempt":1}', "Progress: step_id:"),
        (b'{"type":"something","step_id":1,"attempt":1}', "Reply: status: Field required"),
        (b'{"type":7,"step_id":1,"attempt":1}', "Reply: status: Field required"),
        (b"[1]", "Reply: body must be a JSON object"),
        (b"\xff", "Reply: body is not UTF-8 JSON"),
    ],
)
def test_malformed_messages_on_the_replies_queue_say_what_is_wrong(
    body: bytes, problem: str
) -> None:
    with pytest.raises(InvalidMessageError, match=problem):
        parse_on_replies(body)


def test_a_progress_message_encodes_with_its_type() -> None:
    body = Progress(type="step.started", step_id=5, attempt=1, agent="a").encode()
    assert json.loads(body) == {
        "v": 1,
        "type": "step.started",
        "step_id": 5,
        "attempt": 1,
        "agent": "a",
    }


# -- which clock ran out ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    started_at: datetime | None
    complete_by: datetime
    timeout_s: float = 60.0
    wait_timeout_s: float = 30.0
    heartbeat_timeout_s: float | None = None


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_an_unstarted_step_past_its_envelope_is_the_wait_clock_and_not_charged() -> None:
    expiry = clocks.expired(Row(started_at=None, complete_by=T0 + timedelta(seconds=90)))
    assert expiry == clocks.Expiry(
        charged=False,
        error=StoredError(
            "WaitTimeout",
            "wait clock: no agent started the request within 90 s (wait timeout 30 s + timeout "
            "60 s), and no reply came",
        ),
    )
    assert expiry.reason == "wait expired"


def test_a_started_step_past_its_timeout_is_the_execution_clock_and_charged() -> None:
    row = Row(started_at=T0, complete_by=T0 + timedelta(seconds=60))
    expiry = clocks.expired(row)
    assert expiry.charged
    assert expiry.reason == "expired"
    assert expiry.error == StoredError(
        "ExecutionTimeout",
        "execution clock: no reply within the step's timeout of 60 s after the agent started it",
    )


def test_a_started_step_whose_heartbeat_deadline_came_first_is_the_heartbeat_clock() -> None:
    row = Row(started_at=T0, complete_by=T0 + timedelta(seconds=12.5), heartbeat_timeout_s=1.5)
    expiry = clocks.expired(row)
    assert expiry.charged
    assert expiry.error == StoredError(
        "HeartbeatTimeout", "heartbeat clock: no heartbeat for 1.5 s"
    )


def test_a_heartbeating_step_that_reached_its_timeout_is_the_execution_clock() -> None:
    """The heartbeat clock is capped by the execution clock: at the cap, the timeout fired."""
    row = Row(started_at=T0, complete_by=T0 + timedelta(seconds=60), heartbeat_timeout_s=1)
    assert clocks.expired(row).error.type == "ExecutionTimeout"


def test_a_request_the_broker_dropped_is_the_wait_clock() -> None:
    assert clocks.not_taken(2500, "expired") == clocks.Expiry(
        charged=False,
        error=StoredError("WaitTimeout", "wait clock: no agent took the request within 2.5 s"),
    )


# -- the agent's heartbeat ------------------------------------------------------------------


def _call(beat: Any = None) -> Call:
    return Call(
        input={},
        idempotency_key="k",
        attempt=1,
        deadline=time.monotonic() + 60,
        step_id=1,
        run_id=1,
        workflow="w",
        step="s",
        action="a",
        kind="forward",
        beat=beat,
    )


def test_heartbeat_without_a_heartbeat_clock_does_nothing() -> None:
    _call().heartbeat()  # no error, nothing to send


def test_heartbeats_are_rate_limited_to_one_per_interval_from_any_thread() -> None:
    sent: list[float] = []
    lock = threading.Lock()

    def send() -> None:
        with lock:
            sent.append(time.monotonic())

    call = _call(Beat(0.05, send))
    stop = time.monotonic() + 0.3

    def hammer() -> None:
        while time.monotonic() < stop:
            call.heartbeat()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # The first interval starts with `started`: at most one per 0.05 s over 0.3 s, where four
    # unthrottled threads would send thousands.
    assert 1 <= len(sent) <= 6


# -- run deadlines ---------------------------------------------------------------------------


def _workflow(**options: Any) -> Workflow:
    return Workflow("w", [Step("a", "svc", "go")], **options)


def test_a_workflow_has_no_deadline_unless_given_one() -> None:
    flow = _workflow()
    assert (flow.deadline, flow.on_deadline) == (None, OnDeadline.ALERT)
    late = _workflow(deadline=3600, on_deadline="compensate")
    assert (late.deadline, late.on_deadline) == (3600.0, OnDeadline.COMPENSATE)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"deadline": 0}, r"workflow 'w': deadline must be > 0, got 0"),
        ({"deadline": -1}, r"deadline must be > 0, got -1"),
        ({"deadline": float("inf")}, r"deadline must be > 0, got inf"),
        ({"deadline": True}, r"deadline must be > 0, got True"),
        ({"deadline": "60"}, r"deadline must be > 0, got '60'"),
        (
            {"deadline": 60, "on_deadline": "retry"},
            r"on_deadline must be 'alert', 'cancel' or 'compensate', got 'retry'",
        ),
    ],
)
def test_invalid_deadlines_are_definition_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        _workflow(**options)
