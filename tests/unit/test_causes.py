"""An alert's cause (sasflow.store.outbox.causes): what groups alerts into one incident."""

from __future__ import annotations

from sasflow.store.outbox.causes import CAUSE_CHARS, MESSAGE_CHARS, cause_of, normalise


def _failure(message: str, *, step: str = "charge", workflow: str | None = "order") -> str:
    detail = {"step": step, "error": {"type": "PermanentError", "message": message}}
    return cause_of("step_failed", "17", workflow, detail).key


def test_numbers_ids_uuids_and_quoted_values_are_not_part_of_a_cause() -> None:
    assert (
        normalise(
            "card declined for order 1042 (ref 1b4e28ba-2fa1-11d2-883f-0016d3cca427, "
            "txn 9f86d081884c7d65, user 'ann')  at 12:30:01.5"
        )
        == "card declined for order <n> (ref <id>, txn <id>, user <v>) at <n>"
    )
    assert _failure("declined for order 1") == _failure("declined for order 2")
    assert normalise("the step's timeout, don't retry") == "the step's timeout, don't retry"


def test_a_failure_s_cause_is_its_workflow_step_error_type_and_message() -> None:
    first = cause_of(
        "step_failed",
        "17",
        "order",
        {"step": "charge", "error": {"type": "PermanentError", "message": "declined 7"}},
    )
    assert first.text == "step_failed in order at step 'charge': PermanentError: declined <n>"
    assert _failure("declined") != _failure("declined", step="refund")
    assert _failure("declined") != _failure("declined", workflow="refund")
    assert _failure("declined") != _failure("timed out")


def test_a_run_level_failure_and_other_kinds_have_their_own_natural_cause() -> None:
    run_level = cause_of("step_failed", "run-3", "order", {"type": "X", "message": "gone"})
    assert run_level.text == "step_failed in order at the run level: X: gone"
    lost = [
        cause_of("agent_lost", f"instance-{i}", None, {"agent": "payments"}).text for i in range(2)
    ]
    assert lost == ["agent_lost of agent payments"] * 2
    callback = cause_of(
        "callback_failed", "callback:9", None, {"url": "https://u:p@hooks.example/x?t=1"}
    )
    assert callback.text == "callback_failed to https://hooks.example"
    assert cause_of("agent_outage", "payments", None, {}).text == "agent_outage of payments"
    # A failure of no known workflow: nothing says two are alike.
    assert (
        _failure("x", workflow=None)
        != cause_of(
            "step_failed",
            "18",
            None,
            {"step": "charge", "error": {"type": "PermanentError", "message": "x"}},
        ).key
    )


def test_causes_are_bounded_whatever_the_message() -> None:
    long = cause_of(
        "step_failed", "1", "w" * 100, {"step": "s" * 100, "error": {"type": "T" * 300}}
    )
    assert len(long.text) <= CAUSE_CHARS
    assert len(long.key) == 64
    assert len(normalise("word " * 100)) == MESSAGE_CHARS


def test_parked_steps_of_one_cause_are_one_incident_as_failures_are() -> None:
    """A partner down parks many runs' steps: one incident, not one per step."""
    detail = {"step": "charge", "error": {"type": "ConnectionError", "message": "down 3"}}
    first = cause_of("step_parked", "17", "order", detail)
    assert first.text == "step_parked in order at step 'charge': ConnectionError: down <n>"
    assert first.key == cause_of("step_parked", "18", "order", detail).key


def test_overdue_approvals_of_one_step_are_one_cause() -> None:
    first = cause_of("approval_overdue", "17", "refund", {"step": "review"})
    assert first.text == "approval_overdue in refund at step 'review'"
    assert first.key == cause_of("approval_overdue", "18", "refund", {"step": "review"}).key
