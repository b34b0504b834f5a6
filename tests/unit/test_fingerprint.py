"""A workflow's fingerprint: equal for equal definitions (in any process), different for any
change that runs of a version depend on, equal across a builder's body or `max_backlog`."""

from __future__ import annotations

from typing import Any

import pytest

from sasflow import Step, StepContext, StepPolicy, Workflow


def _from_a(ctx: StepContext) -> Any:
    return ctx.outputs["a"]


def _other(ctx: StepContext) -> Any:
    return ctx.run_input


def _order(**changes: Any) -> Workflow:
    steps = changes.pop("steps", None) or [
        Step("a", "svc", "go"),
        Step("b", "svc", "go", input=changes.pop("input", _from_a), policy=StepPolicy(timeout=5)),
    ]
    return Workflow("order", steps, version=changes.pop("version", 1), **changes)


def test_equal_definitions_have_one_stable_fingerprint() -> None:
    assert _order().fingerprint == _order().fingerprint
    assert len(_order().fingerprint) == 64
    assert int(_order().fingerprint, 16) >= 0


@pytest.mark.parametrize(
    "changed",
    [
        {"steps": [Step("a", "svc", "go"), Step("c", "svc", "go", input=_from_a)]},
        {"steps": [Step("a", "svc", "go"), Step("b", "svc", "other", input=_from_a)]},
        {"steps": [Step("a", "svc", "go"), Step("b", "svc", "go", after=(), input=_from_a)]},
        {"input": _other},
        {"steps": [Step("a", "svc", "go"), Step("b", "svc", "go", input=_from_a)]},  # policy
        {"on_failure": "compensate"},
        {"output": _other},
        {"deadline": 60.0},
        {"version": 2},
    ],
    ids=[
        "step renamed",
        "action",
        "dependency",
        "builder",
        "policy",
        "on_failure",
        "output",
        "deadline",
        "version",
    ],
)
def test_a_change_runs_depend_on_changes_the_fingerprint(changed: dict[str, Any]) -> None:
    assert _order(**changed).fingerprint != _order().fingerprint


def test_a_builder_body_and_max_backlog_leave_it_alone() -> None:
    """Builders count by qualified name (a fixed body is a deploy, not a version);
    `max_backlog` is a door's setting."""

    def _from_a(ctx: StepContext) -> Any:  # the same name, another body
        return {"wrapped": ctx.outputs["a"]}

    _from_a.__qualname__ = "_from_a"
    assert _order(input=_from_a).fingerprint == _order().fingerprint
    assert _order(max_backlog=10).fingerprint == _order().fingerprint


def test_parking_changes_the_fingerprint_only_when_it_is_set() -> None:
    """Versions recorded before parking keep their fingerprints: the defaults add nothing."""
    parked_step = [
        Step("a", "svc", "go"),
        Step("b", "svc", "go", input=_from_a, policy=StepPolicy(timeout=5, on_exhausted="park")),
    ]
    assert _order(on_exhausted="fail").fingerprint == _order().fingerprint
    assert _order(on_exhausted="park").fingerprint != _order().fingerprint
    assert _order(on_error="fail").fingerprint != _order().fingerprint
    assert _order(steps=parked_step).fingerprint != _order().fingerprint


def test_a_definition_without_parking_keeps_the_fingerprint_it_had_before_parking() -> None:
    """The value computed by the code before the parking options existed (ee6ee05): versions
    recorded then still match the definitions that load them now."""
    before = "91035acb83385ee75f19c73ca14727303a457dd2bb6f3acebfc8044bac0bf267"
    assert _order().fingerprint == before
