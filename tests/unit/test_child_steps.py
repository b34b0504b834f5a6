"""Child steps (`Step.child`) without a database: their definition and its checks, the
registry's depth and cycle checks, and what `store.decide` and the compensation chain make of
their records (docs/concepts.md, "Child workflows")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from sasflow import Registry, Step, Workflow
from sasflow.children import CHILD_AGENT, MAX_CHILDREN, MAX_DEPTH, child_key
from sasflow.commands import NewRun, RunError, StoredError
from sasflow.errors import DefinitionError
from sasflow.registry import ExternalAgent
from sasflow.states import OnFailure, RunState, StepKind, StepState
from sasflow.store.runs.children import CompensateChild, StartChild
from sasflow.store.runs.compensation import CHILD_UNDO, chain
from sasflow.store.runs.decide import (
    FailWaiting,
    Finish,
    RaiseAlert,
    Skip,
    StartCompensation,
    decide,
)
from sasflow.store.runs.records import RunRecord, StepRecord
from tests.unit.test_decide import _step as decide_record

SHOP = ExternalAgent("shop")


def _parent(child_input: str | None = "steps.pack") -> Workflow:
    return Workflow(
        "order",
        [
            Step("pack", "shop", "pack", compensate="unpack"),
            Step.child("ship", workflow="shipping", input=child_input),
            Step("charge", "shop", "charge", after=("pack",)),
        ],
        on_failure="compensate",
    )


def _run(state: RunState = RunState.RUNNING) -> RunRecord:
    return RunRecord(
        id=7,
        workflow="order",
        version=1,
        business_key="A-1",
        input={"order": 1},
        state=state,
        on_failure=OnFailure.COMPENSATE,
        error=None,
    )


def _step(
    name: str,
    state: StepState,
    *depends_on: str,
    agent: str = "shop",
    input: Any = None,  # noqa: A002
    output: Any = None,
    kind: StepKind = StepKind.FORWARD,
    compensate: str | None = None,
) -> StepRecord:
    """test_decide's record, of `agent` with `input`."""
    record = decide_record(
        name, state, *depends_on, kind=kind, output=output, compensate=compensate
    )
    return dataclasses.replace(record, agent=agent, input=input)


def test_a_child_step_is_declared_with_its_workflow_and_input() -> None:
    ship = _parent().step("ship")
    assert (ship.agent, ship.action, ship.is_child) == (CHILD_AGENT, "shipping", True)
    assert ship.child_spec is not None
    assert ship.shape()["child"] == {"workflow": "shipping", "version": None, "input": "steps.pack"}
    assert ship.child_spec.read({"x": 1}, {"pack": {"parcel": "p"}}) == {"parcel": "p"}
    assert _parent(None).step("ship").child_spec.read({"x": 1}, {}) == {"x": 1}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (lambda: [Step.child("ship", workflow="shipping")], "cannot be a root step"),
        (
            lambda: [
                Step("a", "shop", "a"),
                Step.child("ship", workflow="shipping", input="steps.z"),
            ],
            "'z' is not a step it depends on",
        ),
        (
            lambda: [Step.child("ship", workflow="shipping", input="nowhere")],
            "must be `input.<field>",
        ),
        (
            lambda: [Step.child("ship", workflow="shipping", version=0)],
            "version must be an integer >= 1",
        ),
        (
            lambda: [Step("a", "shop", "a"), Step("b", CHILD_AGENT, "shipping")],
            "reserved for child steps",
        ),
        (
            lambda: [
                Step("a", "shop", "a"),
                *(
                    Step.child(f"c{i}", workflow="shipping", after=("a",))
                    for i in range(MAX_CHILDREN + 1)
                ),
            ],
            f"more than {MAX_CHILDREN} children per run",
        ),
    ],
)
def test_a_child_step_declared_wrong_is_a_definition_error(
    steps: Callable[[], list[Step]], message: str
) -> None:
    with pytest.raises(DefinitionError, match=message):
        Workflow("order", steps())


def _chain_of(depth: int) -> list[Workflow]:
    """w0 -> w1 -> ... -> w<depth>: each runs the next as its child."""
    return [
        Workflow(
            f"w{i}",
            [Step("a", "shop", "a")]
            + ([Step.child("child", workflow=f"w{i + 1}")] if i < depth else []),
        )
        for i in range(depth + 1)
    ]


def test_the_registry_refuses_children_nested_too_deep_and_own_descendants() -> None:
    Registry(_chain_of(MAX_DEPTH), [SHOP])  # five levels below w0: at the bound
    with pytest.raises(DefinitionError, match=f"6 deep, more than {MAX_DEPTH}"):
        Registry(_chain_of(MAX_DEPTH + 1), [SHOP])
    first = Workflow("a", [Step("x", "shop", "x"), Step.child("b", workflow="b")])
    second = Workflow("b", [Step("x", "shop", "x"), Step.child("a", workflow="a")])
    with pytest.raises(DefinitionError, match="its own descendant: a v1 -> b v1 -> a v1"):
        Registry([first, second], [SHOP])
    # A child not registered here is checked when it runs.
    Registry([first], [SHOP])


def test_a_ready_child_step_submits_its_child_keyed_on_the_parent_and_step() -> None:
    pack = _step("pack", StepState.PROCESSED, output={"parcel": "p1"})
    ship = _step("ship", StepState.WAITING, "pack", agent=CHILD_AGENT)
    charge = _step("charge", StepState.PROCESSED, "pack")
    decided = decide(_run(), [pack, ship, charge], _parent())
    assert decided == [
        StartChild(ship, NewRun("shipping", {"parcel": "p1"}, key=child_key(7, "ship")))
    ]


def test_a_child_path_that_leads_nowhere_fails_the_step() -> None:
    pack = _step("pack", StepState.PROCESSED, output={})
    ship = _step("ship", StepState.WAITING, "pack", agent=CHILD_AGENT)
    charge = _step("charge", StepState.PENDING, "pack")
    decided = decide(_run(), [pack, ship, charge], _parent("steps.pack.parcel"))
    assert isinstance(decided[0], FailWaiting)
    assert decided[0].error.type == "ChildInputError"


def test_a_running_child_is_in_flight_when_the_parent_fails_elsewhere() -> None:
    pack = _step("pack", StepState.PROCESSED, output={}, compensate="unpack")
    running = {"child": {"run_id": 99, "workflow": "shipping"}}
    ship = _step("ship", StepState.WAITING, "pack", agent=CHILD_AGENT, input=running)
    charge = _step("charge", StepState.ERROR, "pack")
    charge = dataclasses.replace(charge, error=StoredError("Declined", "no").to_json())
    decided = decide(_run(), [pack, ship, charge], _parent())
    # Not skipped, not started again: the run compensates once the child ended.
    assert [type(d) for d in decided] == [StartCompensation]
    compensating = _run(RunState.COMPENSATING)
    assert decide(compensating, [pack, ship, charge], _parent()) == []


def test_a_completed_child_is_undone_in_its_place_of_the_parents_chain() -> None:
    done = {"child": {"run_id": 99, "workflow": "shipping"}}
    pack = _step("pack", StepState.PROCESSED, output={}, compensate="unpack")
    ship = _step("ship", StepState.PROCESSED, "pack", agent=CHILD_AGENT, input=done)
    records = chain(7, [pack, ship])
    assert [(r["name"], r["action"], r["state"]) for r in records] == [
        ("ship", CHILD_UNDO, StepState.WAITING),
        ("pack", "unpack", StepState.WAITING),
    ]
    undo = _step(
        "ship",
        StepState.WAITING,
        agent=CHILD_AGENT,
        kind=StepKind.COMPENSATION,
        input={"input": done, "output": None},
    )
    then = _step("pack", StepState.WAITING, "ship", kind=StepKind.COMPENSATION)
    error = RunError(StoredError("Declined", "no").to_json(), "charge")
    compensating = dataclasses.replace(_run(RunState.COMPENSATING), error=error)
    steps = [pack, ship, undo, then]
    assert decide(compensating, steps, None) == [CompensateChild(undo, 99)]
    # Started: it waits for the child; the child compensated: the chain goes on.
    started = dataclasses.replace(undo, input={**undo.input, "compensating": True})
    assert decide(compensating, [pack, ship, started, then], None) == []
    processed = dataclasses.replace(undo, state=StepState.PROCESSED)
    assert [
        type(d).__name__ for d in decide(compensating, [pack, ship, processed, then], None)
    ] == ["Release"]
    failed = dataclasses.replace(undo, state=StepState.ERROR)
    decided = decide(compensating, [pack, ship, failed, then], None)
    assert [type(d) for d in decided] == [Skip, Finish, RaiseAlert]
    assert isinstance(decided[1], Finish)
    assert decided[1].state == RunState.COMPENSATION_FAILED
