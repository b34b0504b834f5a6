"""A run's attempts as bars, computed from its events without I/O (console/timeline.py), and
the resubmit form's choices (each one a resubmission the service function accepts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sasflow.api.console import timeline
from sasflow.api.console.run_view import resubmit_choices
from sasflow.states import RunState

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def step_event(seconds: float, before: str | None, after: str, **extra: Any) -> dict[str, Any]:
    return {
        "entity": "step",
        "step_id": 10,
        "step": "charge",
        "created_at": at(seconds),
        "from_state": before,
        "to_state": after,
        "attempt": extra.get("attempt"),
        "reason": extra.get("reason"),
        "detail": extra.get("detail"),
    }


RUN = {"created_at": T0, "finished_at": None}
BOOM = {"type": "Timeout", "message": "the gateway did not answer"}


def test_each_attempt_is_queued_then_executing_then_backing_off_with_its_error() -> None:
    """Attempt 1 waits 0.5 s, runs 2 s, fails (ready again 3 s later); attempt 2 is claimed
    1 s after that, started by an agent 0.5 s later, and still runs at `now`."""
    history = [
        step_event(0.5, "pending", "processing", attempt=1),
        step_event(
            2.5,
            "processing",
            "pending",
            attempt=1,
            reason="failed",
            detail={"error": BOOM, "not_before": at(5.5).isoformat()},
        ),
        step_event(6.5, "pending", "processing", attempt=2),
        step_event(7.0, "processing", "processing", attempt=2, reason="started"),
    ]
    steps = [{"id": 10, "name": "charge", "kind": "forward", "state": "processing"}]
    bars = timeline.bars(RUN, steps, history, now=at(10))
    first, second = bars.attempts
    assert [(s.kind, s.seconds, s.ongoing) for s in first.segments] == [
        ("queued", 0.5, False),
        ("executing", 2.0, False),
        ("backoff", 3.0, False),
    ]
    assert (first.number, first.outcome, first.error) == (1, "failed", BOOM)
    assert [(s.kind, s.seconds, s.ongoing) for s in second.segments] == [
        ("queued", 1.0, False),
        ("waiting", 0.5, False),  # claimed, until the agent said it started
        ("executing", 3.0, True),
    ]
    assert (second.number, second.outcome, second.error) == (2, "running", None)
    assert (bars.start, bars.end) == (T0, at(10))
    assert (bars.left(first.segments[1]), bars.width(first.segments[1])) == (5.0, 20.0)


def test_a_step_is_ready_when_its_dependencies_are_done_and_queued_until_claimed() -> None:
    """A dependent step becomes pending by an event; unclaimed, it is queued until now."""
    history = [step_event(4.0, "waiting", "pending")]
    steps = [{"id": 10, "name": "charge", "kind": "forward", "state": "pending"}]
    (only,) = timeline.bars(RUN, steps, history, now=at(6)).attempts
    assert (only.number, only.outcome) == (None, "queued")
    assert [(s.kind, s.start, s.seconds, s.ongoing) for s in only.segments] == [
        ("queued", at(4.0), 2.0, True)
    ]


def test_a_permanent_error_has_no_backoff_and_a_finished_run_ends_the_span() -> None:
    history = [
        step_event(0.25, "pending", "processing", attempt=1),
        step_event(1.25, "processing", "error", attempt=1, reason="error", detail={"error": BOOM}),
    ]
    steps = [{"id": 10, "name": "charge", "kind": "forward", "state": "error"}]
    bars = timeline.bars({"created_at": T0, "finished_at": at(2)}, steps, history, now=at(60))
    (only,) = bars.attempts
    assert [s.kind for s in only.segments] == ["queued", "executing"]
    assert (only.outcome, only.error, bars.end) == ("error", BOOM, at(2))
    assert only.seconds("executing") == 1.0


def test_an_attempt_no_agent_started_waited_and_one_replied_to_executed() -> None:
    """Without a `started` event: a wait-clock expiry (no agent took the request) was waiting
    all along; an attempt an agent replied to was executing (an agent that does not say when
    it starts)."""
    history = [
        step_event(0.0, "pending", "processing", attempt=1),
        step_event(2.0, "processing", "pending", attempt=1, reason="wait expired"),
        step_event(2.5, "pending", "processing", attempt=2),
        step_event(3.0, "processing", "processed", attempt=2),
    ]
    steps = [{"id": 10, "name": "charge", "kind": "forward", "state": "processed"}]
    first, second = timeline.bars(RUN, steps, history, now=at(9)).attempts
    assert [(s.kind, s.seconds) for s in first.segments] == [("queued", 0.0), ("waiting", 2.0)]
    assert [(s.kind, s.seconds) for s in second.segments] == [
        ("queued", 0.5),
        ("executing", 0.5),
    ]
    assert (first.outcome, second.outcome) == ("wait expired", "processed")


def test_durations_read_as_people_read_them() -> None:
    assert [timeline.duration(s) for s in (0.04, 1.25, 185, 7440)] == [
        "40 ms",
        "1.25 s",
        "3 min 5 s",
        "2 h 4 min",
    ]


def test_a_completed_run_offers_no_failed_steps_default() -> None:
    """Resubmitting a completed run "from its failed steps" is refused (it has none): its
    form's first, default choice is its first step."""
    forward = [{"name": "a"}, {"name": "b"}]
    assert resubmit_choices(RunState.COMPLETED, forward)[0] == ("a", "step a and after")
    assert resubmit_choices(RunState.ERROR, forward)[0] == ("", "its failed steps")
    assert resubmit_choices(RunState.COMPENSATION_FAILED, forward) == [
        ("", "its compensation (retried)")
    ]
