"""What advancing a run does, decided from its rows alone: `decide(run, steps, workflow)` returns
the transitions, and `store.advance` applies them in its transaction.

An active run: waiting steps whose dependencies are processed get their input built (the
workflow's input builders run here) and become pending; a failed step, an input that cannot be
built, a run output that cannot be built or a workflow version that is not loaded applies the
run's failure policy (not-started steps skipped, then error and an alert, or compensation);
when every step is done the run completes with the workflow's output. A compensating run: once
nothing is in flight, its compensation chain is created, released step by step, and the run
ends `compensated`, or `compensation_failed` with an alert.

No I/O here: the unit tests (tests/unit/test_decide.py) give rows and read transitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sasflow.commands import RunError, StoredError
from sasflow.errors import InvalidInputError
from sasflow.messages import dumps
from sasflow.states import (
    ACTIVE_RUN_STATES,
    DONE_STEP_STATES,
    NOT_STARTED_STEP_STATES,
    OnFailure,
    RunState,
    StepKind,
    StepState,
)
from sasflow.store.outbox.alerts import COMPENSATION_FAILED, STEP_FAILED, Alert
from sasflow.store.runs.compensation import chain
from sasflow.store.runs.records import RunRecord, StepRecord
from sasflow.store.runs.submit import build_step_input
from sasflow.workflow import StepContext, Workflow


@dataclass(frozen=True, slots=True)
class NotLoaded:
    """The run's workflow version is not in the registry of `by` (a scheduler)."""

    by: str


Definition = Workflow | NotLoaded | None
"""The run's workflow as the advancing process has it; None: it has no registry (the supervisor
and operators), so no input is built: only failures and compensation are decided."""


@dataclass(frozen=True, slots=True)
class MakeReady:
    """A waiting step whose dependencies are processed becomes pending with its input."""

    step: StepRecord
    input: Any


@dataclass(frozen=True, slots=True)
class FailWaiting:
    """A waiting step whose input builder failed goes to error."""

    step: StepRecord
    error: StoredError


@dataclass(frozen=True, slots=True)
class Skip:
    """A step not started (in `from_state`) is skipped, unless a scheduler claimed it
    meanwhile: then it is in flight."""

    step: StepRecord
    from_state: StepState
    reason: str


@dataclass(frozen=True, slots=True)
class Release:
    """A waiting compensation step whose predecessor is processed becomes pending."""

    step: StepRecord


@dataclass(frozen=True, slots=True)
class StartCompensation:
    """The run goes `compensating` with `error`. Always the last transition of a decision:
    whether compensation can start depends on which skips took, so the store applies these and
    decides again for the run as compensating (its forward steps only)."""

    error: RunError


@dataclass(frozen=True, slots=True)
class CreateChain:
    """Insert the compensation steps (compensation.chain's records); the first is pending."""

    steps: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Finish:
    """The run ends in `state` with its output or its error."""

    state: RunState
    output: Any = None
    error: RunError | None = None


@dataclass(frozen=True, slots=True)
class RaiseAlert:
    """Raise `alert` unless the same one is open already."""

    alert: Alert


Transition = (
    MakeReady | FailWaiting | Skip | Release | StartCompensation | CreateChain | Finish | RaiseAlert
)


def decide(run: RunRecord, steps: Sequence[StepRecord], workflow: Definition) -> list[Transition]:
    """The transitions that bring `run` up to date with `steps` (all its steps, forward and
    compensation, in any order), in the order to apply them; empty when nothing changes."""
    forward = [s for s in steps if s.kind == StepKind.FORWARD]
    if run.state in ACTIVE_RUN_STATES:
        return _forward(run, forward, workflow)
    if run.state == RunState.COMPENSATING:
        return _compensation(run, forward, [s for s in steps if s.kind == StepKind.COMPENSATION])
    return []


def _forward(run: RunRecord, steps: Sequence[StepRecord], workflow: Definition) -> list[Transition]:
    # The states as the transitions leave them, so the failure policy sees steps just made
    # ready or failed.
    state = {s.name: s.state for s in steps}
    errors = {s.name: s.error for s in steps}
    outputs = {s.name: s.output for s in steps if s.state == StepState.PROCESSED}
    ctx = StepContext(
        run_input=run.input, outputs=outputs, run_id=run.id, business_key=run.business_key
    )
    decided: list[Transition] = []
    if isinstance(workflow, Workflow):
        for step in steps:
            deps_done = all(state.get(d) == StepState.PROCESSED for d in step.depends_on)
            if step.state != StepState.WAITING or not deps_done:
                continue
            try:
                step_input = build_step_input(workflow, step.name, ctx)
            except InvalidInputError as exc:
                error = StoredError("InvalidInputError", str(exc))
                decided.append(FailWaiting(step, error))
                state[step.name] = StepState.ERROR
                errors[step.name] = error.to_json()
                continue
            decided.append(MakeReady(step, step_input))
            state[step.name] = StepState.PENDING

    failed = [s for s in steps if state[s.name] == StepState.ERROR]
    if failed:
        first = failed[0]
        decided += _failed(run, steps, state, first, RunError(errors[first.name], first.name))
    elif isinstance(workflow, NotLoaded):
        unknown = StoredError(
            "UnknownWorkflowError",
            f"workflow {run.workflow!r} version {run.version} is not loaded by "
            f"{workflow.by}; deploy it to every scheduler, then resubmit the run",
        )
        decided += _failed(run, steps, state, None, RunError.of_run(unknown))
    elif all(s in DONE_STEP_STATES for s in state.values()):
        decided += _complete(run, steps, state, workflow, ctx)
    return decided


def _complete(
    run: RunRecord,
    steps: Sequence[StepRecord],
    state: dict[str, StepState],
    workflow: Workflow | None,
    ctx: StepContext,
) -> list[Transition]:
    if workflow is None:
        return [Finish(RunState.COMPLETED, output=dict(ctx.outputs))]
    try:
        output = workflow.output(ctx)
        dumps(output)
    except Exception as exc:  # noqa: BLE001 - user code: the run's failure policy applies
        message = f"run output builder raised {type(exc).__name__}: {exc}"
        error = RunError.of_run(StoredError("InvalidOutputError", message))
        return _failed(run, steps, state, None, error)
    return [Finish(RunState.COMPLETED, output=output)]


def _failed(
    run: RunRecord,
    steps: Sequence[StepRecord],
    state: dict[str, StepState],
    step: StepRecord | None,
    error: RunError,
) -> list[Transition]:
    """The run's failure policy: compensation, or error and an alert. `step`: the step that
    failed, None for a failure of the run itself."""
    compensating = run.on_failure == OnFailure.COMPENSATE
    decided: list[Transition] = []
    for s in steps:
        current = state[s.name]
        if current not in NOT_STARTED_STEP_STATES:
            continue
        if compensating and _in_flight(s.kind, current, s.attempt):
            continue  # a retry of an attempt with unknown outcome: it must finish first
        decided.append(Skip(s, current, "run failed"))
    if compensating:
        decided.append(StartCompensation(error))
        return decided
    where = f"step {step.name!r}" if step is not None else "the run level"
    message = (
        f"run {run.id} of {run.workflow} (key {run.business_key}) failed at {where}: "
        f"{error.describe()}"
    )
    alert = Alert(
        STEP_FAILED,
        str(step.id) if step is not None else f"run-{run.id}",
        message,
        run_id=run.id,
        step_id=step.id if step is not None else None,
        detail=error.to_json(),
    )
    decided += [Finish(RunState.ERROR, error=error), RaiseAlert(alert)]
    return decided


def _compensation(
    run: RunRecord, forward: Sequence[StepRecord], steps: Sequence[StepRecord]
) -> list[Transition]:
    """A `compensating` run: wait for in-flight steps, create the chain, release its next step,
    and end in `compensated` or `compensation_failed`."""
    if any(_in_flight(s.kind, s.state, s.attempt) for s in forward):
        return []  # an in-flight step may still succeed: it must be undone too
    if not steps:
        created = chain(run.id, forward)
        if not created:
            return [Finish(RunState.COMPENSATED, error=run.error)]
        return [CreateChain(tuple(created))]
    failed = [s for s in steps if s.state == StepState.ERROR]
    if failed:
        step = failed[0]
        decided: list[Transition] = [
            Skip(s, s.state, "compensation failed")
            for s in steps
            if s.state in NOT_STARTED_STEP_STATES
        ]
        error = RunError(step.error, step.name, compensation=True)
        message = (
            f"run {run.id} of {run.workflow} (key {run.business_key}): compensating "
            f"step {step.name!r} failed ({error.describe()}); the run needs an operator"
        )
        alert = Alert(
            COMPENSATION_FAILED,
            str(step.id),
            message,
            run_id=run.id,
            step_id=step.id,
            detail=error.to_json(),
        )
        decided += [Finish(RunState.COMPENSATION_FAILED, error=error), RaiseAlert(alert)]
        return decided
    if all(s.state == StepState.PROCESSED for s in steps):
        return [Finish(RunState.COMPENSATED, error=run.error)]  # keep why it was compensated
    state = {s.name: s.state for s in steps}
    return [
        Release(s)
        for s in steps
        if s.state == StepState.WAITING
        and all(state.get(d) == StepState.PROCESSED for d in s.depends_on)
    ]


def _in_flight(kind: StepKind, state: StepState, attempt: int) -> bool:
    """Processing, or a forward step waiting to retry an attempt whose outcome is unknown."""
    return state == StepState.PROCESSING or (
        kind == StepKind.FORWARD and state == StepState.PENDING and attempt > 0
    )
