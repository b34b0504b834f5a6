"""Event waits (`Step.wait_for`) as definitions and as `decide` opens them: what they match,
what they refuse, and what their timeout does to the run's failure policy."""

from __future__ import annotations

from typing import Any

import pytest

from sasflow import Step, Workflow
from sasflow.commands import RunError, StoredError
from sasflow.errors import DefinitionError
from sasflow.states import OnFailure, RunState, StepKind, StepState
from sasflow.store import schema
from sasflow.store.runs.decide import FailWaiting, OpenWait, StartCompensation, decide
from sasflow.store.runs.records import RunRecord, StepRecord
from sasflow.waits import EVENT_AGENT, Default, MatchPath


def _flow(match: str = "input.order.id", on_timeout: Any = "fail") -> Workflow:
    return Workflow(
        "order",
        [
            Step("a", "svc", "go"),
            Step.wait_for(
                "paid",
                event="payment_confirmed",
                match=match,
                timeout=60,
                on_timeout=on_timeout,
            ),
            Step("b", "svc", "go"),
        ],
    )


def _run(run_input: Any, on_failure: OnFailure = OnFailure.ERROR) -> RunRecord:
    return RunRecord(
        id=7,
        workflow="order",
        version=1,
        business_key="k",
        input=run_input,
        state=RunState.RUNNING,
        on_failure=on_failure,
        error=None,
    )


def _step(
    step_id: int, name: str, state: StepState, *deps: str, output: Any = None, error: Any = None
) -> StepRecord:
    return StepRecord(
        id=step_id,
        run_id=7,
        name=name,
        kind=StepKind.FORWARD,
        state=state,
        depends_on=deps,
        attempt=0,
        agent="svc",
        compensate_action=None,
        priority=0,
        pool=None,
        input=None,
        output=output,
        error=error,
        timeout_s=30.0,
        max_failures=3,
        backoff_initial_s=1.0,
        backoff_multiplier=2.0,
        backoff_max_s=300.0,
        give_up_s=3600.0,
        wait_timeout_s=30.0,
        heartbeat_timeout_s=None,
    )


def test_wait_for_makes_an_agentless_step_named_by_its_event() -> None:
    step = _flow().step("paid")
    assert (step.agent, step.action, step.is_event_wait) == (EVENT_AGENT, "payment_confirmed", True)
    assert step.wait is not None
    assert step.wait.match == MatchPath("input", ("order", "id"))


@pytest.mark.parametrize(
    ("match", "timeout", "on_timeout"),
    [
        ("order_id", 60, "fail"),  # no source
        ("input.", 60, "fail"),
        ("steps.a", 60, "fail"),  # no field
        ("input.id", 0, "fail"),
        ("input.id", 60, "retry"),
    ],
)
def test_wait_for_refuses_a_bad_definition(match: str, timeout: float, on_timeout: str) -> None:
    with pytest.raises(DefinitionError):
        Step.wait_for("w", event="e", match=match, timeout=timeout, on_timeout=on_timeout)


def test_a_wait_cannot_be_a_root_nor_read_an_unknown_step() -> None:
    with pytest.raises(DefinitionError, match="cannot be a root step"):
        Workflow("w", [Step.wait_for("w", event="e", match="input.id", timeout=1)])
    with pytest.raises(DefinitionError, match="unknown step 'nope'"):
        Workflow(
            "w",
            [
                Step("a", "svc", "go"),
                Step.wait_for("w", event="e", match="steps.nope.x", timeout=1),
            ],
        )


def test_a_path_cannot_read_a_step_named_input() -> None:
    """`steps.input.x` would read the run's input (the source "input"), not the step's output."""
    with pytest.raises(DefinitionError, match="a step named 'input' cannot be read"):
        MatchPath.parse("steps.input.id")


def test_a_match_path_reads_text_from_the_input_or_an_earlier_output() -> None:
    outputs = {"a": {"ref": 42, "flag": True, "deep": {"x": None}}}
    assert MatchPath.parse("steps.a.ref").read({}, outputs) == "42"
    assert MatchPath.parse("steps.a.flag").read({}, outputs) == "true"
    assert MatchPath.parse("steps.a.deep.x").read({}, outputs) is None
    assert MatchPath.parse("steps.a.deep").read({}, outputs) is None  # an object: no match
    assert MatchPath.parse("input.id").read({"id": "A-1"}, {}) == "A-1"
    assert MatchPath.parse("input.id").read({}, {}) is None


def test_a_ready_wait_opens_with_its_correlation_and_timeout() -> None:
    a = _step(1, "a", StepState.PROCESSED, output={})
    paid = _step(2, "paid", StepState.WAITING, "a")
    b = _step(3, "b", StepState.WAITING, "paid")
    assert decide(_run({"order": {"id": "A-1"}}), [a, paid, b], _flow()) == [
        OpenWait(
            paid,
            {
                "event": "payment_confirmed",
                "correlation": "A-1",
                "timeout_s": 60.0,
                "on_timeout": "fail",
            },
            "A-1",
            60.0,
        )
    ]
    opened = decide(_run({"order": {"id": 5}}), [a, paid, b], _flow(on_timeout=Default([1])))
    assert isinstance(opened[0], OpenWait)
    assert opened[0].input["default"] == [1]


def test_a_wait_without_a_correlation_value_fails() -> None:
    a = _step(1, "a", StepState.PROCESSED, output={})
    paid = _step(2, "paid", StepState.WAITING, "a")
    b = _step(3, "b", StepState.WAITING, "paid")
    [failed, *_] = decide(_run({}), [a, paid, b], _flow())
    assert isinstance(failed, FailWaiting)
    assert failed.error.type == "CorrelationMissingError"


def test_a_wait_timed_out_with_compensate_compensates_a_run_whose_policy_is_error() -> None:
    error = StoredError("EventTimeoutError", "late", {"compensate": True}).to_json()
    a = _step(1, "a", StepState.PROCESSED, output={})
    paid = _step(2, "paid", StepState.ERROR, "a", error=error)
    b = _step(3, "b", StepState.WAITING, "paid")
    decided = decide(_run({}), [a, paid, b], _flow(on_timeout="compensate"))
    assert decided[-1] == StartCompensation(RunError(error, "paid"))


def test_the_claims_index_leaves_open_waits_out_and_theirs_hold_them() -> None:
    indexes = {str(i.name): i for i in schema.steps.indexes}
    for name in ("ix_steps_ready", "ix_steps_event_waits", "ix_steps_event_timeouts"):
        predicate = str(indexes[name].dialect_options["postgresql"]["where"])
        assert f"'{EVENT_AGENT}'" in predicate, (name, predicate)
