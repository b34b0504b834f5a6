"""Conditions decided from a run's rows (store.decide): a step whose condition does not hold is
skipped with the condition and the values it read, what depends only on skipped steps is
skipped too (unless it runs then), a fan-in with one processed dependency runs, and a run
whose remaining steps are all skipped completes."""

from __future__ import annotations

from sasflow.commands import StoredError
from sasflow.states import RunState, StepState
from sasflow.store.runs.decide import (
    CONDITION_FALSE,
    DEPENDENCIES_SKIPPED,
    FailWaiting,
    Finish,
    MakeReady,
    NeedsAdvance,
    Skip,
    decide,
)
from sasflow.store.runs.records import StepRecord
from sasflow.when import Cond
from sasflow.workflow import IfSkipped, Step, Workflow
from tests.unit.test_decide import _kinds, _run, _step

CAPTURED = Cond("steps.charge.captured", "==", True)


def _refund(*, refund_if_skipped: IfSkipped = "skip") -> Workflow:
    """charge -> refund (when captured) -> notify; audit after (charge, refund); close after
    notify with `if_skipped`."""
    return Workflow(
        "order",
        [
            Step("charge", "svc", "go"),
            Step("refund", "svc", "go", when=CAPTURED),
            Step("notify", "svc", "go"),
            Step("audit", "svc", "go", after=("charge", "refund")),
            Step("close", "svc", "go", after=("notify",), if_skipped=refund_if_skipped),
        ],
    )


def _rows(captured: object) -> list[StepRecord]:
    return [
        _step("charge", StepState.PROCESSED, output={"captured": captured}),
        _step("refund", StepState.WAITING, "charge"),
        _step("notify", StepState.WAITING, "refund"),
        _step("audit", StepState.WAITING, "charge", "refund"),
        _step("close", StepState.WAITING, "notify"),
    ]


def test_a_step_whose_condition_holds_becomes_ready() -> None:
    rows = _rows(True)

    assert [MakeReady(rows[1], {"n": 1})] == decide(_run(), rows, _refund())


def test_a_false_condition_skips_the_step_and_what_depends_only_on_it_in_one_decision() -> None:
    """refund is skipped with its condition and the value read; notify and close (only skipped
    dependencies) follow in the same decision; audit (charge processed) runs."""
    rows = _rows(False)

    transitions = decide(_run(), rows, _refund())

    assert transitions[0] == Skip(
        rows[1],
        StepState.WAITING,
        CONDITION_FALSE,
        {"condition": "steps.charge.captured == True", "values": {"steps.charge.captured": False}},
    )
    assert _kinds(transitions) == [
        ("Skip", "refund"),
        ("Skip", "notify"),
        ("MakeReady", "audit"),
        ("Skip", "close"),
    ]
    assert transitions[1] == Skip(
        rows[2], StepState.WAITING, DEPENDENCIES_SKIPPED, {"skipped": ["refund"]}
    )


def test_a_step_that_runs_if_skipped_runs_after_skipped_dependencies() -> None:
    rows = _rows(False)

    transitions = decide(_run(), rows, _refund(refund_if_skipped="run"))

    assert ("MakeReady", "close") in _kinds(transitions)


def test_a_run_whose_remaining_steps_are_all_skipped_completes() -> None:
    rows = [
        _step("charge", StepState.PROCESSED, output={"captured": False}),
        _step("refund", StepState.WAITING, "charge"),
        _step("notify", StepState.WAITING, "refund"),
        _step("audit", StepState.PROCESSED, "charge", "refund", output={"ok": 1}),
        _step("close", StepState.WAITING, "notify"),
    ]

    transitions = decide(_run(), rows, _refund())

    assert _kinds(transitions) == [
        ("Skip", "refund"),
        ("Skip", "notify"),
        ("Skip", "close"),
        ("Finish", None),
    ]
    assert transitions[-1] == Finish(RunState.COMPLETED, output={"audit": {"ok": 1}, "close": None})


def test_a_condition_that_cannot_compare_fails_its_step_and_the_run() -> None:
    workflow = Workflow(
        "order",
        [
            Step("charge", "svc", "go"),
            Step("big", "svc", "go", when=Cond("steps.charge.n", ">", 3)),
        ],
    )
    rows = [
        _step("charge", StepState.PROCESSED, output={"n": "many"}),
        _step("big", StepState.WAITING, "charge"),
    ]

    transitions = decide(_run(), rows, workflow)

    assert transitions[0] == FailWaiting(
        rows[1],
        StoredError(
            "ConditionError", "step 'big': steps.charge.n > 3: cannot order 'many' against 3"
        ),
    )
    assert ("Finish", None) in _kinds(transitions)


def test_a_skipped_step_never_runs_its_input_builder() -> None:
    """The condition is decided first: no advance duty is asked to build a skipped step's
    input."""
    workflow = Workflow(
        "order",
        [
            Step("charge", "svc", "go"),
            Step("refund", "svc", "go", when=CAPTURED, input=lambda ctx: ctx.outputs),
        ],
    )
    rows = [
        _step("charge", StepState.PROCESSED, output={"captured": False}),
        _step("refund", StepState.WAITING, "charge"),
    ]

    transitions = decide(_run(), rows, workflow)

    assert not any(isinstance(t, NeedsAdvance) for t in transitions)
    assert _kinds(transitions) == [("Skip", "refund"), ("Finish", None)]


def test_without_the_definition_skipped_dependencies_are_left_to_a_scheduler() -> None:
    """The supervisor (no registry) cannot read a condition: it hands the run over."""
    rows = [
        _step("charge", StepState.PROCESSED, output={"captured": False}),
        _step("refund", StepState.SKIPPED, "charge"),
        _step("notify", StepState.WAITING, "refund"),
    ]

    assert [NeedsAdvance("no registry")] == decide(_run(), rows, None)
