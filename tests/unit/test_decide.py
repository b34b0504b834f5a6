"""Advancing a run, decided from its rows without a database (store.decide): what becomes ready,
when a run completes, its failure policy and its compensation chain."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

import pytest

from sasflow.commands import RunError, StoredError
from sasflow.states import OnFailure, RunState, StepKind, StepState
from sasflow.store.outbox.alerts import COMPENSATION_FAILED, STEP_FAILED, Alert
from sasflow.store.runs.decide import (
    BuildFailed,
    Built,
    CreateChain,
    FailWaiting,
    Finish,
    MakeReady,
    NeedsAdvance,
    NotLoaded,
    RaiseAlert,
    Release,
    Skip,
    StartCompensation,
    StartTimer,
    Transition,
    decide,
)
from sasflow.store.runs.records import RunRecord, StepRecord
from sasflow.workflow import Step, StepContext, Workflow

BOOM = StoredError("Boom", "no").to_json()


def _run(
    state: RunState = RunState.RUNNING,
    on_failure: OnFailure = OnFailure.ERROR,
    error: RunError | None = None,
) -> RunRecord:
    return RunRecord(
        id=7,
        workflow="order",
        version=1,
        business_key="A-1",
        input={"n": 1},
        state=state,
        on_failure=on_failure,
        error=error,
    )


_ids = iter(range(100, 10_000))


def _step(
    name: str,
    state: StepState,
    *depends_on: str,
    kind: StepKind = StepKind.FORWARD,
    attempt: int = 0,
    output: Any = None,
    error: Any = None,
    compensate: str | None = None,
) -> StepRecord:
    return StepRecord(
        id=next(_ids),
        run_id=7,
        name=name,
        kind=kind,
        state=state,
        depends_on=depends_on,
        attempt=attempt,
        agent="svc",
        compensate_action=compensate,
        priority=0,
        pool=None,
        input={"in": name},
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


def _diamond(**options: Any) -> Workflow:
    return Workflow(
        "order",
        [
            Step("a", "svc", "go", input=lambda ctx: {"from": "run", **ctx.run_input}),
            Step("b", "svc", "go", after=("a",), input=lambda ctx: ctx.outputs["a"]),
            Step("c", "svc", "go", after=("a",)),
            Step("d", "svc", "go", after=("b", "c")),
        ],
        **options,
    )


def _kinds(transitions: list[Transition]) -> list[tuple[str, str | None]]:
    """Each transition's type and the step it moves (None for the run's own)."""
    named = ((type(t).__name__, getattr(t, "step", None)) for t in transitions)
    return [(kind, step.name if step is not None else None) for kind, step in named]


# -- the forward flow -----------------------------------------------------------------------


def test_successors_of_a_processed_step_become_ready_with_their_input() -> None:
    """Waiting steps whose dependencies are all processed become ready: with the run's input
    at once for the default builder; a step with a builder of its own is left to the advance
    duty (its user code never runs here), then made ready with what the duty built. A fan-in
    whose other branch is not done keeps waiting."""
    a = _step("a", StepState.PROCESSED, output={"x": 1})
    b, c = _step("b", StepState.WAITING, "a"), _step("c", StepState.WAITING, "a")
    d = _step("d", StepState.WAITING, "b", "c")

    transitions = decide(_run(), [a, b, c, d], _diamond())

    assert [MakeReady(c, {"n": 1}), NeedsAdvance("input builders", steps=("b",))] == transitions
    built = Built(inputs={"b": {"x": 1}})
    assert [MakeReady(b, {"x": 1}), MakeReady(c, {"n": 1})] == decide(
        _run(), [a, b, c, d], _diamond(), built
    )


def test_a_run_whose_steps_are_all_processed_completes_with_the_workflow_output() -> None:
    """The run's output is the workflow's (the terminal steps' outputs by default)."""
    steps = [_step(n, StepState.PROCESSED, output={"step": n}) for n in "abcd"]

    assert [Finish(RunState.COMPLETED, output={"d": {"step": "d"}})] == decide(
        _run(), steps, _diamond()
    )


def test_a_run_with_a_step_still_processing_waits() -> None:
    steps = [
        _step("a", StepState.PROCESSED, output={}),
        _step("b", StepState.PROCESSING, "a", attempt=1),
        _step("c", StepState.PROCESSED, "a", output={}),
        _step("d", StepState.WAITING, "b", "c"),
    ]

    assert decide(_run(), steps, _diamond()) == []


def test_without_a_registry_no_input_is_built_but_a_done_run_completes() -> None:
    """The supervisor and operators advance runs without definitions: a step made ready is
    left to a scheduler's advance duty; a done run completes with the processed steps'
    outputs as they are."""
    a = _step("a", StepState.PROCESSED, output={"x": 1})
    b = _step("b", StepState.SKIPPED, "a")

    waiting = [a, _step("b", StepState.WAITING, "a")]
    assert [NeedsAdvance("no registry")] == decide(_run(), waiting, None)
    assert [Finish(RunState.COMPLETED, output={"a": {"x": 1}})] == decide(_run(), [a, b], None)


def test_runs_that_are_neither_active_nor_compensating_are_left_alone() -> None:
    steps = [_step("a", StepState.ERROR, error=BOOM)]
    for state in (RunState.ERROR, RunState.COMPLETED, RunState.CANCELLED, RunState.COMPENSATED):
        assert decide(_run(state), steps, _diamond()) == []


# -- failures -------------------------------------------------------------------------------


def test_a_failed_step_fails_the_run_skips_what_did_not_start_and_raises_an_alert() -> None:
    """Steps in flight are left to finish; the run's error names the step and keeps its error."""
    a = _step("a", StepState.PROCESSED, output={})
    b = _step("b", StepState.ERROR, "a", attempt=3, error=BOOM)
    c = _step("c", StepState.PROCESSING, "a", attempt=1)
    d = _step("d", StepState.WAITING, "b", "c")

    transitions = decide(_run(), [a, b, c, d], _diamond())

    error = RunError(BOOM, "b")
    assert [
        Skip(d, StepState.WAITING, "run failed"),
        Finish(RunState.ERROR, error=error),
        RaiseAlert(
            Alert(
                STEP_FAILED,
                str(b.id),
                "run 7 of order (key A-1) failed at step 'b': Boom: no",
                run_id=7,
                step_id=b.id,
                detail={"step": "b", "error": BOOM},
                workflow="order",
            )
        ),
    ] == transitions


def test_an_input_builder_that_raises_fails_its_step_then_the_run() -> None:
    """The step goes to error with the error the advance duty built (InvalidInputError); a
    sibling just made ready is skipped."""

    def explode(ctx: StepContext) -> Any:
        raise ValueError("bad input")

    workflow = Workflow(
        "order",
        [
            Step("a", "svc", "go"),
            Step("b", "svc", "go", after=("a",), input=explode),
            Step("c", "svc", "go", after=("a",)),
        ],
    )
    a = _step("a", StepState.PROCESSED, output={})
    b, c = _step("b", StepState.WAITING, "a"), _step("c", StepState.WAITING, "a")

    message = "step 'b': input builder raised ValueError: bad input"
    error = StoredError("InvalidInputError", message)
    transitions = decide(_run(), [a, b, c], workflow, Built(inputs={"b": BuildFailed(error)}))

    assert _kinds(transitions) == [
        ("FailWaiting", "b"),
        ("MakeReady", "c"),
        ("Skip", "c"),
        ("Finish", None),
        ("RaiseAlert", None),
    ]
    assert FailWaiting(b, error) == transitions[0]
    assert Skip(c, StepState.PENDING, "run failed") == transitions[2]
    assert Finish(RunState.ERROR, error=RunError(error.to_json(), "b")) == transitions[3]


def test_a_run_output_builder_that_raises_fails_the_run_itself() -> None:
    def explode(ctx: StepContext) -> Any:
        raise KeyError("total")

    steps = [_step(n, StepState.PROCESSED, output={}) for n in "abcd"]
    failure = StoredError("InvalidOutputError", "run output builder raised KeyError: 'total'")

    workflow = _diamond(output=explode)
    assert [NeedsAdvance("output builder", output=True)] == decide(_run(), steps, workflow)
    transitions = decide(
        _run(), steps, workflow, Built(output=BuildFailed(failure), output_built=True)
    )

    error = RunError.of_run(failure)
    assert Finish(RunState.ERROR, error=error) == transitions[0]
    alert = transitions[1]
    assert isinstance(alert, RaiseAlert)
    assert (f"run-{7}", None, error.to_json()) == (
        alert.alert.subject,
        alert.alert.step_id,
        alert.alert.detail,
    )


def test_a_workflow_version_that_is_not_loaded_is_left_to_a_scheduler_that_has_it() -> None:
    """The scheduler that lacks the version neither fails nor skips anything: the run is
    left to the advance duty of a scheduler that has the version."""
    steps = [_step("a", StepState.PROCESSED, output={}), _step("b", StepState.WAITING, "a")]

    transitions = decide(_run(), steps, NotLoaded("scheduler-1"))

    reason = "workflow 'order' v1 is not loaded by scheduler-1"
    assert [NeedsAdvance(reason)] == transitions
    done = [_step("a", StepState.PROCESSED, output={}), _step("b", StepState.PROCESSED, "a")]
    assert [NeedsAdvance(reason)] == decide(_run(), done, NotLoaded("scheduler-1"))
    in_flight = [steps[0], _step("b", StepState.PROCESSING, "a", attempt=1)]
    assert decide(_run(), in_flight, NotLoaded("scheduler-1")) == []


def test_a_step_the_definition_lacks_fails_with_the_reason_not_a_key_error() -> None:
    """A definition changed under its version (refused at start since fingerprints; runs of
    an older database may still meet it) names the missing step."""
    workflow = Workflow("order", [Step("a", "svc", "go"), Step("c", "svc", "go")])
    a = _step("a", StepState.PROCESSED, output={})
    b = _step("b", StepState.WAITING, "a")

    transitions = decide(_run(), [a, b], workflow)

    failed = transitions[0]
    assert isinstance(failed, FailWaiting)
    assert "has no step 'b': its definition changed without a new version" in failed.error.message


def test_a_compensating_workflow_skips_what_did_not_start_and_starts_compensation() -> None:
    """A retry of an attempt with an unknown outcome is not skipped: it must finish first.
    Starting compensation ends the decision."""
    a = _step("a", StepState.PROCESSED, output={}, compensate="undo")
    b = _step("b", StepState.ERROR, "a", attempt=3, error=BOOM)
    c = _step("c", StepState.PENDING, "a", attempt=1)
    d = _step("d", StepState.WAITING, "b", "c")
    run = _run(on_failure=OnFailure.COMPENSATE)

    transitions = decide(run, [a, b, c, d], _diamond(on_failure=OnFailure.COMPENSATE))

    assert [
        Skip(d, StepState.WAITING, "run failed"),
        StartCompensation(RunError(BOOM, "b")),
    ] == transitions


# -- compensation ---------------------------------------------------------------------------


def _compensating(error: RunError | None = None) -> RunRecord:
    return _run(RunState.COMPENSATING, OnFailure.COMPENSATE, error or RunError(BOOM, "c"))


def test_compensation_waits_for_forward_steps_in_flight() -> None:
    """Processing, or pending to retry an attempt with an unknown outcome."""
    a = _step("a", StepState.PROCESSED, output={}, compensate="undo")
    for in_flight in (
        _step("b", StepState.PROCESSING, "a", attempt=1),
        _step("b", StepState.PENDING, "a", attempt=2),
    ):
        assert decide(_compensating(), [a, in_flight], None) == []


def test_the_chain_undoes_processed_steps_with_an_action_in_reverse_order() -> None:
    """Each compensation step waits for the one before it; its input is the step's input and
    output, its policy and agent the step's."""
    a = _step("a", StepState.PROCESSED, output={"a": 1}, compensate="undo_a")
    b = _step("b", StepState.PROCESSED, "a", output={"b": 1}, compensate="undo_b")
    c = _step("c", StepState.PROCESSED, "a", output={"c": 1})
    d = _step("d", StepState.ERROR, "b", "c", error=BOOM)

    transitions = decide(_compensating(), [a, b, c, d], None)

    assert len(transitions) == 1
    created = transitions[0]
    assert isinstance(created, CreateChain)
    seen = [
        (r["name"], r["action"], r["state"], r["depends_on"], r["input"], r["kind"])
        for r in created.steps
    ]
    assert [row[:5] for row in seen] == [
        ("b", "undo_b", StepState.PENDING, [], {"input": {"in": "b"}, "output": {"b": 1}}),
        ("a", "undo_a", StepState.WAITING, ["b"], {"input": {"in": "a"}, "output": {"a": 1}}),
    ]
    assert {StepKind.COMPENSATION} == {row[5] for row in seen}
    assert (
        created.steps[0]["timeout_s"],
        created.steps[0]["max_failures"],
        created.steps[0]["agent"],
    ) == (30.0, 3, "svc")


def test_nothing_to_undo_compensates_the_run_at_once_keeping_its_error() -> None:
    cancelled = RunError.of_run(StoredError("Cancelled", "why", {"by": "ops"}))
    steps = [_step("a", StepState.PROCESSED, output={}), _step("b", StepState.SKIPPED, "a")]

    assert [Finish(RunState.COMPENSATED, error=cancelled)] == decide(
        _compensating(cancelled), steps, None
    )


def _chain(*states: StepState, error: Any = None) -> list[StepRecord]:
    names = ["undo_b", "undo_a", "undo_0"][: len(states)]
    return [
        _step(
            name,
            state,
            *([names[i - 1]] if i else []),
            kind=StepKind.COMPENSATION,
            error=error if state == StepState.ERROR else None,
        )
        for i, (name, state) in enumerate(zip(names, states, strict=False))
    ]


def test_the_chain_releases_its_next_step_once_the_one_before_is_processed() -> None:
    forward = [_step("a", StepState.PROCESSED, output={}, compensate="undo")]
    chain = _chain(StepState.PROCESSED, StepState.WAITING, StepState.WAITING)

    assert [Release(chain[1])] == decide(_compensating(), [*forward, *chain], None)


def test_a_processed_chain_compensates_the_run_keeping_why_it_was_compensated() -> None:
    error = RunError(BOOM, "c")
    chain = _chain(StepState.PROCESSED, StepState.PROCESSED)

    assert [Finish(RunState.COMPENSATED, error=error)] == decide(_compensating(error), chain, None)


def test_a_failed_compensation_step_skips_the_rest_and_needs_an_operator() -> None:
    chain = _chain(StepState.ERROR, StepState.WAITING, error=BOOM)

    transitions = decide(_compensating(), chain, None)

    error = RunError(BOOM, "undo_b", compensation=True)
    assert [
        Skip(chain[1], StepState.WAITING, "compensation failed"),
        Finish(RunState.COMPENSATION_FAILED, error=error),
        RaiseAlert(
            Alert(
                COMPENSATION_FAILED,
                str(chain[0].id),
                "run 7 of order (key A-1): compensating step 'undo_b' failed (Boom: no); the "
                "run needs an operator",
                run_id=7,
                step_id=chain[0].id,
                detail={"step": "undo_b", "compensation": True, "error": BOOM},
                workflow="order",
            )
        ),
    ] == transitions


# -- the run's error as stored --------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "stored"),
    [
        (RunError(BOOM, "charge"), {"step": "charge", "error": BOOM}),
        (
            RunError(BOOM, "undo", compensation=True),
            {"step": "undo", "compensation": True, "error": BOOM},
        ),
        (
            RunError.of_run(StoredError("InvalidOutputError", "m")),
            StoredError("InvalidOutputError", "m").to_json(),
        ),
        (
            RunError.of_run(StoredError("Cancelled", "why", {"by": "ops"})),
            {"type": "Cancelled", "message": "why", "by": "ops"},
        ),
    ],
)
def test_a_run_error_is_stored_as_before_and_read_back_equal(error: RunError, stored: Any) -> None:
    """The `runs.error` JSON keeps its shapes (docs/protocol.md 7.3), key order included."""
    assert list(stored.items()) == list(error.to_json().items())
    assert error == RunError.from_json(stored)


@pytest.mark.parametrize(
    "stored",
    [
        None,
        "text",
        [1, 2],
        {"step": "a"},
        {"step": 3, "error": BOOM},
        {"step": "a", "error": BOOM, "more": 1},
        {"step": "a", "compensation": False, "error": BOOM},
        {"error": BOOM},
    ],
)
def test_any_stored_run_error_is_written_back_unchanged(stored: Any) -> None:
    """A run's error of an unexpected shape is kept whole (as an error of the run itself)."""
    read = RunError.from_json(stored)

    assert stored == (read.to_json() if read is not None else None)


def test_a_run_error_describes_its_error_for_alert_messages() -> None:
    assert [
        RunError(BOOM, "a").describe(),
        RunError({"message": "m"}).describe(),
        RunError(BOOM, "a", compensation=True).describe(),
        RunError(None, "a").describe(),
        RunError("oops").describe(),
    ] == [
        "Boom: no",
        "Error: m",
        "Boom: no",
        "{'step': 'a', 'error': None}",
        "oops",
    ]


def test_rows_are_frozen() -> None:
    """A decision never changes the rows it was given."""
    step = _step("a", StepState.WAITING)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.state = StepState.PENDING  # type: ignore[misc]


# -- timer steps ----------------------------------------------------------------------------


def _wake(ctx: StepContext) -> datetime:
    return datetime.fromisoformat(ctx.run_input["at"])


def _napping() -> Workflow:
    return Workflow(
        "nap",
        [
            Step("a", "svc", "go"),
            Step.sleep("short", seconds=2.5),
            Step.sleep("until", until=_wake, after=("a",)),
        ],
    )


def test_a_ready_timer_starts_its_sleep_without_an_agent() -> None:
    """A fixed sleep starts at once, due `seconds` later (the store adds them to the database's
    now()); a sleep `until` a time is left to the advance duty, which computes the time, then
    starts due at that time. Neither is made ready for an agent (MakeReady)."""
    a = _step("a", StepState.PROCESSED, output={})
    short = _step("short", StepState.WAITING, "a")
    until = _step("until", StepState.WAITING, "a")

    assert [
        StartTimer(short, {"sleep_s": 2.5}, seconds=2.5),
        NeedsAdvance("input builders", steps=("until",)),
    ] == decide(_run(), [a, short, until], _napping())
    at = "2026-12-01T09:00:00+00:00"
    built = Built(inputs={"until": {"until": at}})
    assert [
        StartTimer(short, {"sleep_s": 2.5}, seconds=2.5),
        StartTimer(until, {"until": at}, until=at),
    ] == decide(_run(), [a, short, until], _napping(), built)


def test_a_timer_whose_until_fails_fails_its_run() -> None:
    a = _step("a", StepState.PROCESSED, output={})
    short = _step("short", StepState.PROCESSED, "a", output={"slept_until": "x"})
    until = _step("until", StepState.WAITING, "a")
    failed = BuildFailed(StoredError("InvalidInputError", "naive datetime"))

    decided = decide(_run(), [a, short, until], _napping(), Built(inputs={"until": failed}))

    assert _kinds(decided)[:2] == [("FailWaiting", "until"), ("Finish", None)]


def test_a_timers_until_must_give_an_aware_datetime() -> None:
    """`until` runs as the timer's input builder: it gives the ISO time, and refuses a naive
    time (which clock would it be on?)."""
    builder = _napping().step("until").input
    ctx = StepContext(
        run_input={"at": "2026-12-01T09:00:00+01:00"}, outputs={}, run_id=7, business_key="k"
    )

    assert builder(ctx) == {"until": "2026-12-01T09:00:00+01:00"}
    with pytest.raises(TypeError, match="timezone-aware"):
        builder(dataclasses.replace(ctx, run_input={"at": "2026-12-01T09:00:00"}))


# -- parked steps ---------------------------------------------------------------------------


def test_a_parked_step_holds_its_run_while_its_siblings_go_on() -> None:
    """A parked step is neither done nor failed: the run neither completes nor fails, and
    the steps that do not depend on it still become ready."""
    a = _step("a", StepState.PROCESSED, output={"x": 1})
    b = _step("b", StepState.PARKED, "a", attempt=3, error=BOOM)
    c = _step("c", StepState.WAITING, "a")
    d = _step("d", StepState.WAITING, "b", "c")

    assert [MakeReady(c, {"n": 1})] == decide(_run(), [a, b, c, d], _diamond())
    done_c = _step("c", StepState.PROCESSED, "a", output={})
    assert decide(_run(), [a, b, done_c, d], _diamond()) == []


def test_a_run_failing_at_another_step_skips_its_parked_step() -> None:
    a = _step("a", StepState.PROCESSED, output={})
    b = _step("b", StepState.PARKED, "a", attempt=3, error=BOOM)
    c = _step("c", StepState.ERROR, "a", attempt=1, error=BOOM)
    d = _step("d", StepState.WAITING, "b", "c")

    transitions = decide(_run(), [a, b, c, d], _diamond())

    assert _kinds(transitions)[:2] == [("Skip", "b"), ("Skip", "d")]
    assert Skip(b, StepState.PARKED, "run failed") in transitions
    assert Finish(RunState.ERROR, error=RunError(BOOM, "c")) in transitions
