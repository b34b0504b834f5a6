"""What advancing a run does, decided from its rows alone: `decide(run, steps, workflow)` returns
the transitions, and `store.advance` applies them in its transaction.

An active run: waiting steps whose dependencies are done become pending with their input: the
run's input for the default builder, decided here; or they are skipped, when their condition
(`Step(when=...)`, declarative data) does not hold or every dependency was skipped, and what
depends on them is decided in the same pass. User code never runs here (it would run
inside the store's transaction, on the scheduler's loop): a step with an input builder of its
own, or a run output built by `Workflow.output`, is left for the scheduler's advance duty
(`NeedsAdvance`), which runs that code off the loop with a time budget and decides again with
what it built (`Built`). A run whose workflow version this scheduler has not loaded is left the
same way, for a scheduler that has it. A failed step, or an input or output that could not be
built, applies the run's failure policy (not-started steps skipped, then error and an alert, or
compensation); when every step is done the run completes with the workflow's output. A
compensating run: once nothing is in flight, its compensation chain is created, released step
by step, and the run ends `compensated`, or `compensation_failed` with an alert.

No I/O here: the unit tests (tests/unit/test_decide.py) give rows and read transitions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sasflow.children import ChildSpec, child_key
from sasflow.commands import NewRun, RunError, StoredError
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
from sasflow.store.runs.children import (
    CompensateChild,
    StartChild,
    child_compensation,
    started_child,
)
from sasflow.store.runs.compensation import chain
from sasflow.store.runs.mapping import EndMap, ExpandMap, expand, expanded, progress
from sasflow.store.runs.records import RunRecord, StepRecord
from sasflow.waits import MAX_CORRELATION, MISSING, WaitSpec
from sasflow.when import ConditionError, evaluate
from sasflow.workflow import Step, Workflow


@dataclass(frozen=True, slots=True)
class NotLoaded:
    """The run's workflow version is not in the registry of `by` (a scheduler)."""

    by: str


@dataclass(frozen=True, slots=True)
class BuildFailed:
    """User code (an input builder, the output builder) raised, overran its time budget or
    returned what is not JSON."""

    error: StoredError


@dataclass(frozen=True, slots=True)
class Built:
    """What the advance duty built off the loop from a snapshot of the run: inputs by step name,
    and the run's output when it was asked for (`output_built`)."""

    inputs: Mapping[str, Any | BuildFailed] = field(default_factory=dict)
    output: Any | BuildFailed = None
    output_built: bool = False


Definition = Workflow | NotLoaded | None
"""The run's workflow as the advancing process has it; None: it has no registry (the supervisor
and operators), so no input is built: only failures and compensation are decided."""


@dataclass(frozen=True, slots=True)
class MakeReady:
    """A waiting step whose dependencies are processed becomes pending with its input."""

    step: StepRecord
    input: Any


@dataclass(frozen=True, slots=True)
class StartTimer:
    """A waiting timer step whose dependencies are processed becomes pending, due `seconds`
    from now on the database clock, or at `until` (ISO 8601, what its `until` returned); a
    scheduler marks it processed when it is due (store.runs.timers)."""

    step: StepRecord
    input: Any
    seconds: float | None = None
    until: str | None = None


@dataclass(frozen=True, slots=True)
class OpenWait:
    """A waiting event wait (`Step.wait_for`) whose dependencies are processed opens: pending,
    with what it waits for as its input and its `correlation`, timing out `seconds` from now on
    the database clock. It takes the oldest stored event that matches as it opens
    (store.inbound.consume); else its event's ingress or the schedulers match it later."""

    step: StepRecord
    input: Any
    correlation: str
    seconds: float
    escalate_after: float | None = None
    """An approval's: seconds after which it is overdue (`approval_overdue`); None otherwise."""


@dataclass(frozen=True, slots=True)
class FailWaiting:
    """A waiting step whose input builder failed goes to error."""

    step: StepRecord
    error: StoredError


@dataclass(frozen=True, slots=True)
class Skip:
    """A step not started (in `from_state`) is skipped, unless a scheduler claimed it
    meanwhile: then it is in flight. `detail`: what its event records (a condition and the
    values it read)."""

    step: StepRecord
    from_state: StepState
    reason: str
    detail: Any = None


CONDITION_FALSE = "condition false"
"""The reason of a step skipped because its condition (`Step(when=...)`) does not hold."""
DEPENDENCIES_SKIPPED = "dependencies skipped"
"""The reason of a step skipped because every step it depends on was skipped."""


@dataclass(frozen=True, slots=True)
class Release:
    """A waiting compensation step whose predecessor is processed becomes pending, or a
    waiting item of a map (`reason` "map") as the map's parallelism allows."""

    step: StepRecord
    reason: str = "compensation"


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
class NeedsAdvance:
    """The run needs what cannot be done here: user code (the `steps` to build, the run's
    output when `output`), or a scheduler with its version loaded (`steps` empty, `output`
    False). The store marks it for the schedulers' advance duty (runs.advance_due)."""

    reason: str
    steps: tuple[str, ...] = ()
    output: bool = False


@dataclass(frozen=True, slots=True)
class RaiseAlert:
    """Raise `alert` unless the same one is open already."""

    alert: Alert


Transition = (
    MakeReady
    | StartTimer
    | OpenWait
    | FailWaiting
    | Skip
    | Release
    | StartCompensation
    | CreateChain
    | Finish
    | NeedsAdvance
    | RaiseAlert
    | ExpandMap
    | EndMap
    | StartChild
    | CompensateChild
)

NOTHING_BUILT = Built()


def decide(
    run: RunRecord,
    steps: Sequence[StepRecord],
    workflow: Definition,
    built: Built = NOTHING_BUILT,
) -> list[Transition]:
    """The transitions that bring `run` up to date with `steps` (all its steps, forward and
    compensation, in any order), in the order to apply them; empty when nothing changes.
    `built`: what the advance duty built for it off the loop."""
    forward = [s for s in steps if s.kind == StepKind.FORWARD]
    if run.state in ACTIVE_RUN_STATES:
        return _forward(run, forward, workflow, built)
    if run.state == RunState.COMPENSATING:
        return _compensation(run, forward, [s for s in steps if s.kind == StepKind.COMPENSATION])
    return []


def _forward(
    run: RunRecord, records: Sequence[StepRecord], workflow: Definition, built: Built
) -> list[Transition]:
    # The items of maps are decided through their map (store.runs.mapping): the rest of the
    # decision sees the steps of the workflow, the maps as their items left them.
    decided, steps = _maps(records)
    # The states as the transitions leave them, so the failure policy sees steps just made
    # ready or failed.
    state = {s.name: s.state for s in records} | {s.name: s.state for s in steps}
    errors = {s.name: s.error for s in steps}
    running = {s.name for s in steps if expanded(s) is not None or started_child(s) is not None}
    waiting, to_build, unready = _decide_waiting(
        run, steps, workflow, built, state, errors, running
    )
    decided += waiting

    failed = [s for s in steps if state[s.name] == StepState.ERROR]
    if failed:
        first = failed[0]
        # A map made ready in this decision never starts (it is skipped): no items.
        decided = [d for d in decided if not isinstance(d, ExpandMap)]
        items = [s for s in records if s.map_parent is not None]
        decided += _failed(
            run, [*steps, *items], state, first, RunError(errors[first.name], first.name)
        )
        return decided
    done = all(state[s.name] in DONE_STEP_STATES for s in steps)
    if isinstance(workflow, NotLoaded):
        if unready or done:
            reason = f"workflow {run.workflow!r} v{run.version} is not loaded by {workflow.by}"
            decided.append(NeedsAdvance(reason))
        return decided
    if unready:  # no registry here (the supervisor, an operator): a scheduler makes them ready
        decided.append(NeedsAdvance("no registry"))
    if to_build:
        decided.append(NeedsAdvance("input builders", steps=tuple(to_build)))
    elif done:
        decided += _complete(run, steps, state, workflow, outputs_of(steps), built)
    return decided


def _maps(records: Sequence[StepRecord]) -> tuple[list[Transition], list[StepRecord]]:
    """The maps whose items run: waiting items released, or the map ended; and the run's
    steps other than items, each map as that leaves it."""
    items: dict[int, list[StepRecord]] = {}
    for record in records:
        if record.map_parent is not None:
            items.setdefault(record.map_parent, []).append(record)
    decided: list[Transition] = []
    steps: list[StepRecord] = []
    for step in records:
        if step.map_parent is not None:
            continue
        if expanded(step) is None:
            steps.append(step)
            continue
        moved = progress(step, items.get(step.id, []))
        if isinstance(moved, EndMap):
            decided.append(moved)
            step = replace(step, state=moved.state, output=moved.output)  # noqa: PLW2901
            if moved.error is not None:
                step = replace(step, error=moved.error.to_json())  # noqa: PLW2901
        else:
            decided += [Release(item, "map") for item in moved]
        steps.append(step)
    return decided, steps


def _decide_waiting(  # noqa: PLR0917 - the run's rows and what _forward holds of them
    run: RunRecord,
    steps: Sequence[StepRecord],
    workflow: Definition,
    built: Built,
    state: dict[str, StepState],
    errors: dict[str, Any],
    running: set[str],
) -> tuple[list[Transition], list[str], bool]:
    """The waiting steps whose dependencies are done, made ready, failed or skipped (`state`
    and `errors` updated to match); the steps whose input builder must run first; whether a
    step is ready but the definition to make it so is not here. `running`: the maps whose
    items exist (waiting, but made ready already)."""
    decided: list[Transition] = []
    to_build: list[str] = []
    unready = False
    seen: set[str] = set(running)
    # A step skipped may decide its successors in turn: go over the steps until none moves.
    moved = True
    while moved:
        moved = False
        for step in steps:
            if step.name in seen or not _decidable(step, state):
                continue
            seen.add(step.name)
            if not isinstance(workflow, Workflow):
                unready = True
                continue
            made = _skipped(run, step, workflow, steps, state) or _ready(
                run, step, workflow, built, steps
            )
            if made is None:
                to_build.append(step.name)
                continue
            decided.append(made)
            moved = True
            if isinstance(made, FailWaiting):
                state[step.name] = StepState.ERROR
                errors[step.name] = made.error.to_json()
            elif isinstance(made, ExpandMap | EndMap | StartChild):
                # Its items or its child run (it stays waiting), or it ended at once (empty):
                # the store decides again for its successors from the rows as they are then.
                pass
            else:
                state[step.name] = (
                    StepState.SKIPPED if isinstance(made, Skip) else StepState.PENDING
                )
    return decided, to_build, unready


def _decidable(step: StepRecord, state: Mapping[str, StepState]) -> bool:
    """A waiting step whose dependencies are done (processed or skipped): it becomes ready, or
    is skipped."""
    return state[step.name] == StepState.WAITING and all(
        state.get(d) in DONE_STEP_STATES for d in step.depends_on
    )


def _skipped(
    run: RunRecord,
    step: StepRecord,
    workflow: Workflow,
    steps: Sequence[StepRecord],
    state: Mapping[str, StepState],
) -> Skip | FailWaiting | None:
    """A decidable step skipped: every dependency was skipped (unless it runs then,
    `if_skipped="run"`), or its condition does not hold; its condition failing to compare is
    its failure. None: it runs (its input next)."""
    definition = workflow.steps_by_name.get(step.name)
    if definition is None:
        return None  # _ready fails it
    deps = step.depends_on
    if (
        deps
        and definition.if_skipped == "skip"
        and all(state[d] == StepState.SKIPPED for d in deps)
    ):
        return Skip(step, StepState.WAITING, DEPENDENCIES_SKIPPED, {"skipped": list(deps)})
    if definition.when is None:
        return None
    try:
        decision = evaluate(definition.when, run.input, outputs_of(steps))
    except ConditionError as exc:
        return FailWaiting(step, StoredError("ConditionError", f"step {step.name!r}: {exc}"))
    if decision.holds:
        return None
    return Skip(step, StepState.WAITING, CONDITION_FALSE, decision.detail(definition.when))


def outputs_of(steps: Sequence[StepRecord]) -> dict[str, Any]:
    """The outputs of a run's processed forward steps, by name: what builders see."""
    return {
        s.name: s.output
        for s in steps
        if s.kind == StepKind.FORWARD and s.state == StepState.PROCESSED and s.map_parent is None
    }


def _ready(  # noqa: PLR0911 - one return per kind of step
    run: RunRecord,
    step: StepRecord,
    workflow: Workflow,
    built: Built,
    steps: Sequence[StepRecord],
) -> MakeReady | StartTimer | OpenWait | FailWaiting | ExpandMap | EndMap | StartChild | None:
    """A ready waiting step with its input: the run's (the default builder), or what the advance
    duty built; None when its builder must run first. A timer step starts its sleep: a fixed
    one at once, one `until` a time once the advance duty computed that time. A map gets its
    items (or ends at once, empty)."""
    definition = workflow.steps_by_name.get(step.name)
    if definition is None:
        missing = StoredError(
            "DefinitionChangedError",
            f"workflow {run.workflow!r} version {run.version} has no step {step.name!r}: its "
            "definition changed without a new version",
        )
        return FailWaiting(step, missing)
    if definition.child_spec is not None:
        return _start_child(run, step, definition.child_spec, outputs_of(steps))
    if definition.map_spec is not None:
        made = expand(run, step, definition, workflow.parks(step.name), outputs_of(steps))
        return FailWaiting(step, made) if isinstance(made, StoredError) else made
    if definition.takes_run_input:  # a fixed sleep's timer and an event wait too
        return _without_builder(run, step, definition, steps)
    if step.name not in built.inputs:
        return None
    value = built.inputs[step.name]
    if isinstance(value, BuildFailed):
        return FailWaiting(step, value.error)
    # A timer's `until` was its input builder: it built {"until": ISO 8601}.
    return (
        StartTimer(step, value, until=value["until"])
        if definition.is_timer
        else MakeReady(step, value)
    )


def _start_child(
    run: RunRecord, step: StepRecord, spec: ChildSpec, outputs: Mapping[str, Any]
) -> StartChild | FailWaiting:
    """A ready child step submits its child with the input at its path (a path, not user
    code); a path that leads to no value fails it."""
    value = spec.read(run.input, outputs)
    if value is MISSING:
        missing = StoredError(
            "ChildInputError", f"child step {step.name!r}: {spec.input} has no value"
        )
        return FailWaiting(step, missing)
    new = NewRun(spec.workflow, value, key=child_key(run.id, step.name), version=spec.version)
    return StartChild(step, new)


def _without_builder(
    run: RunRecord, step: StepRecord, definition: Step, steps: Sequence[StepRecord]
) -> MakeReady | StartTimer | OpenWait | FailWaiting:
    """A ready step that builds nothing: a fixed sleep, an event wait, or a step taking the
    run's input as it is."""
    if definition.approval_spec is not None and definition.wait is not None:
        # An approval correlates on its run (its id), decided through ops.approvals by step.
        opened = {
            **definition.wait.input(str(run.id)),
            "approval": definition.approval_spec.input(),
        }
        return OpenWait(
            step,
            opened,
            str(run.id),
            definition.wait.timeout,
            escalate_after=definition.approval_spec.escalate_after,
        )
    if definition.wait is not None:
        return _open_wait(run, step, definition.wait, outputs_of(steps))
    if definition.is_timer:
        return StartTimer(step, {"sleep_s": definition.sleep_s}, seconds=definition.sleep_s)
    return MakeReady(step, run.input)


def _open_wait(
    run: RunRecord, step: StepRecord, wait: WaitSpec, outputs: Mapping[str, Any]
) -> OpenWait | FailWaiting:
    """An event wait opens with its correlation read from the run's data (a path, not user
    code); a path that leads to no value fails it."""
    correlation = wait.match.read(run.input, outputs)
    if correlation is None or len(correlation) > MAX_CORRELATION:
        missing = StoredError(
            "CorrelationMissingError",
            f"event wait {step.name!r}: {wait.match} has no value (a string, number or boolean "
            f"of at most {MAX_CORRELATION} characters) to match {wait.event!r} events by",
        )
        return FailWaiting(step, missing)
    return OpenWait(step, wait.input(correlation), correlation, wait.timeout)


def _complete(  # noqa: PLR0917 - the run's rows and what decide() holds of them
    run: RunRecord,
    steps: Sequence[StepRecord],
    state: dict[str, StepState],
    workflow: Workflow | None,
    outputs: Mapping[str, Any],
    built: Built,
) -> list[Transition]:
    if workflow is None or not workflow.has_output_builder:
        default = (
            dict(outputs)
            if workflow is None
            else {name: outputs.get(name) for name in workflow.terminal_steps}
        )
        return [Finish(RunState.COMPLETED, output=default)]
    if not built.output_built:
        return [NeedsAdvance("output builder", output=True)]
    if isinstance(built.output, BuildFailed):
        error = RunError.of_run(built.output.error)
        return _failed(run, steps, state, None, error)
    return [Finish(RunState.COMPLETED, output=built.output)]


def _failed(
    run: RunRecord,
    steps: Sequence[StepRecord],
    state: dict[str, StepState],
    step: StepRecord | None,
    error: RunError,
) -> list[Transition]:
    """The run's failure policy: compensation, or error and an alert. `step`: the step that
    failed, None for a failure of the run itself."""
    # An event wait timed out with on_timeout="compensate" (store.inbound) compensates the run
    # whatever its failure policy.
    forced = isinstance(error.error, dict) and error.error.get("compensate") is True
    compensating = run.on_failure == OnFailure.COMPENSATE or forced
    decided: list[Transition] = []
    for s in steps:
        current = state[s.name]
        if current not in NOT_STARTED_STEP_STATES:
            continue
        if compensating and _in_flight(s.kind, current, s.attempt):
            continue  # a retry of an attempt with unknown outcome: it must finish first
        if started_child(s) is not None:
            continue  # its child runs: in flight, its outcome still arrives
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
        workflow=run.workflow,
    )
    decided += [Finish(RunState.ERROR, error=error), RaiseAlert(alert)]
    return decided


def _compensation(
    run: RunRecord, forward: Sequence[StepRecord], steps: Sequence[StepRecord]
) -> list[Transition]:
    """A `compensating` run: wait for in-flight steps, create the chain, release its next step,
    and end in `compensated` or `compensation_failed`."""
    if any(_in_flight(s.kind, s.state, s.attempt) or started_child(s) is not None for s in forward):
        return []  # an in-flight step (or child run) may still succeed: it must be undone too
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
            workflow=run.workflow,
        )
        decided += [Finish(RunState.COMPENSATION_FAILED, error=error), RaiseAlert(alert)]
        return decided
    if all(s.state == StepState.PROCESSED for s in steps):
        return [Finish(RunState.COMPENSATED, error=run.error)]  # keep why it was compensated
    state = {s.name: s.state for s in steps}
    released: list[Transition] = []
    for s in steps:
        if s.state != StepState.WAITING or not all(
            state.get(d) == StepState.PROCESSED for d in s.depends_on
        ):
            continue
        undoing = child_compensation(s)
        if undoing is None:
            released.append(Release(s))
        elif not undoing[1]:  # its turn: the child compensates; started: it waits for it
            released.append(CompensateChild(s, undoing[0] or 0))
    return released


def _in_flight(kind: StepKind, state: StepState, attempt: int) -> bool:
    """Processing, or a forward step waiting to retry an attempt whose outcome is unknown."""
    return state == StepState.PROCESSING or (
        kind == StepKind.FORWARD and state == StepState.PENDING and attempt > 0
    )
