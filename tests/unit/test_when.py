"""The condition language (sasflow.when): what it accepts, how it evaluates over a run's input
and outputs, which definitions it rejects, and that a workflow's fingerprint covers it."""

from __future__ import annotations

from typing import Any

import pytest

from sasflow.errors import DefinitionError
from sasflow.when import All, Cond, ConditionError, Decision, Not, evaluate
from sasflow.when import Any as AnyOf
from sasflow.workflow import Step, Workflow

INPUT = {"country": "FR", "total": 120, "coupon": None, "tags": [], "vip": True}
OUTPUTS = {"charge": {"captured": True, "amount": 99.5, "ref": "ch_1"}}


@pytest.mark.parametrize(
    ("condition", "holds"),
    [
        (Cond("steps.charge.captured", "==", True), True),
        (Cond("steps.charge.captured", "==", 1), False),  # JSON: true is not 1
        (Cond("input.total", "!=", 120), False),
        (Cond("input.total", "<", 120.5), True),
        (Cond("input.total", "<=", 120), True),
        (Cond("input.total", ">", 120), False),
        (Cond("steps.charge.amount", ">=", 99.5), True),
        (Cond("input.country", "<", "GB"), True),
        (Cond("input.country", "in", ["FR", "DE"]), True),
        (Cond("input.country", "not in", ["FR", "DE"]), False),
        (Cond("input.vip", "in", [1]), False),
        (Cond("input.coupon", "exists"), False),  # null does not exist
        (Cond("input.nothing", "exists"), False),
        (Cond("input.country", "exists"), True),
        (Cond("input.tags", "truthy"), False),
        (Cond("input.vip", "truthy"), True),
        (Cond("input.nothing", "==", None), True),  # a missing value reads as null
        (Cond("steps.charge.ref.deeper", "exists"), False),
        (All(Cond("input.vip", "truthy"), Cond("input.total", ">", 100)), True),
        (All(Cond("input.vip", "truthy"), Cond("input.total", ">", 200)), False),
        (AnyOf(Cond("input.total", ">", 200), Cond("input.country", "==", "FR")), True),
        (Not(Cond("input.country", "==", "FR")), False),
    ],
    ids=str,
)
def test_conditions_evaluate_over_the_input_and_outputs(condition: Any, holds: bool) -> None:
    assert evaluate(condition, INPUT, OUTPUTS).holds is holds


def test_the_decision_keeps_the_values_read_and_the_combinators_stop_early() -> None:
    """The history records what was read; a missing path is not recorded; All stops at the
    first false, so a guarded comparison never orders a missing value."""
    guarded = All(Cond("input.limit", "exists"), Cond("input.limit", ">", 3))

    assert evaluate(guarded, INPUT, OUTPUTS) == Decision(False, {})
    decision = evaluate(
        AnyOf(Cond("input.total", ">", 200), Cond("steps.charge.captured", "truthy")),
        INPUT,
        OUTPUTS,
    )
    assert decision == Decision(True, {"input.total": 120, "steps.charge.captured": True})
    assert decision.detail(Cond("input.total", ">", 200)) == {
        "condition": "input.total > 200",
        "values": {"input.total": 120, "steps.charge.captured": True},
    }


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        (Cond("input.country", ">", 3), "cannot order 'FR' against 3"),
        (Cond("input.missing", "<", 3), "cannot order None against 3"),
        (Cond("input.vip", ">=", 0), "cannot order True against 0"),
    ],
)
def test_an_ordering_the_values_cannot_make_is_a_condition_error(
    condition: Cond, message: str
) -> None:
    with pytest.raises(ConditionError, match=message):
        evaluate(condition, INPUT, OUTPUTS)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Cond("total", "==", 1), "condition path 'total' must be"),
        (lambda: Cond("steps.charge", "==", 1), "condition path 'steps.charge' must be"),
        (lambda: Cond("input.a b", "==", 1), "must be"),
        (lambda: Cond("input.a", "=~", 1), "operator '=~' is not one of"),
        (lambda: Cond("input.a", "exists", True), "takes no value"),
        (lambda: Cond("input.a", "in", "FR"), "must be a list of JSON scalars"),
        (lambda: Cond("input.a", "in", [{"x": 1}]), "must be a list of JSON scalars"),
        (lambda: Cond("input.a", "==", {"x": 1}), "must be a JSON scalar"),
        (lambda: Cond("input.a", "<", None), "orders numbers or strings"),
        (lambda: Cond(3, "==", 1), "path must be a string"),  # type: ignore[arg-type]
        (All, "All\\(\\) needs at least one condition"),
        (lambda: AnyOf(print), "takes conditions"),  # type: ignore[arg-type]
        (lambda: Not("input.a"), "takes conditions"),  # type: ignore[arg-type]
    ],
)
def test_malformed_conditions_are_definition_errors(make: Any, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        make()


def _workflow(when: Any, *, after: tuple[str, ...] | None = None) -> Workflow:
    return Workflow(
        "order",
        [
            Step("a", "svc", "go"),
            Step("side", "svc", "go", after=("a",)),
            Step("b", "svc", "go", after=("a",)),
            Step("c", "svc", "go", after=after, when=when),
        ],
    )


def test_a_condition_may_read_the_input_and_any_step_it_depends_on_indirectly() -> None:
    _workflow(All(Cond("input.x", "exists"), Cond("steps.a.y", "truthy")))  # a -> b -> c


@pytest.mark.parametrize(
    ("when", "after", "message"),
    [
        (Cond("steps.side.y", "truthy"), None, "reads steps.side.y, but 'side' is not a step"),
        (Not(Cond("steps.nope.y", "truthy")), None, "'nope' is not a step it depends on"),
        (Cond("input.x", "truthy"), (), "a root step cannot have a condition"),
        (print, None, "when must be a condition"),
    ],
)
def test_a_condition_naming_a_step_not_depended_on_is_rejected_when_defined(
    when: Any, after: tuple[str, ...] | None, message: str
) -> None:
    with pytest.raises(DefinitionError, match=message):
        _workflow(when, after=after)


def test_if_skipped_takes_skip_or_run() -> None:
    with pytest.raises(DefinitionError, match="if_skipped must be 'skip' or 'run'"):
        Workflow("order", [Step("a", "svc", "go"), Step("b", "svc", "go", if_skipped="maybe")])  # type: ignore[arg-type]


def test_the_fingerprint_changes_with_a_condition_and_stays_without_one() -> None:
    plain = _workflow(None).fingerprint
    first = _workflow(Cond("steps.a.y", "==", 1)).fingerprint
    other_value = _workflow(Cond("steps.a.y", "==", 2)).fingerprint
    other_op = _workflow(Cond("steps.a.y", "!=", 1)).fingerprint
    negated = _workflow(Not(Cond("steps.a.y", "==", 1))).fingerprint

    assert len({plain, first, other_value, other_op, negated}) == 5
    assert first == _workflow(Cond("steps.a.y", "==", 1)).fingerprint
    runs = Workflow("order", [Step("a", "svc", "go"), Step("b", "svc", "go", if_skipped="run")])
    assert (
        runs.fingerprint
        != Workflow("order", [Step("a", "svc", "go"), Step("b", "svc", "go")]).fingerprint
    )


def test_a_workflow_without_conditions_keeps_its_fingerprint() -> None:
    """Versions recorded before conditions keep their fingerprint: the step shape gains no
    key when neither `when` nor `if_skipped` is set."""
    step = Step("a", "svc", "go")

    assert "when" not in step.shape()
    assert "if_skipped" not in step.shape()
