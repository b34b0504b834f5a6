"""Child workflows (`Step.child`) as a run's rows say them (docs/concepts.md, "Child
workflows").

A child step that becomes ready submits its child run through the one door (`record_runs`),
keyed `parent:<run id>:<step>` (one child per parent run and step, however often the step is
made ready), with the link `parent_run_id`/`parent_step` on the child's row; the step stays
`waiting` with `{"child": {"run_id": ...}}` as its input while the child runs, as a map's
record does while its items run. When the child ends (`ended`, in the transaction that ends
it) the parent's step ends with it: processed with the child's output when it completed, in
error with the child's error otherwise; the caller then advances the parent. A compensation
record undoing a child step starts the child's compensation (`compensate`) and ends when the
child is `compensated` (processed) or `compensation_failed` (error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, select, update

from sasflow.children import CHILD_AGENT, CHILD_KEY, MAX_CHILDREN, MAX_DEPTH
from sasflow.commands import NewRun, Refused, StoredError
from sasflow.registry import Registry
from sasflow.states import (
    ACTIVE_RUN_STATES,
    RunState,
    StepKind,
    StepState,
)
from sasflow.store.runs.events import Event
from sasflow.store.runs.records import RunRecord, StepRecord
from sasflow.store.runs.submit import record_runs
from sasflow.store.schema import runs, steps
from sasflow.store.sqltime import now

COMPENSATING_KEY = "compensating"
"""Set in a child step's compensation record once its child's compensation started."""


@dataclass(frozen=True, slots=True)
class StartChild:
    """A ready child step submits its child run (`new`); it stays waiting until the child
    ends."""

    step: StepRecord
    new: NewRun


@dataclass(frozen=True, slots=True)
class CompensateChild:
    """A compensation record of a child step whose turn came: the child run (`run_id`)
    compensates; the record ends with it."""

    step: StepRecord
    run_id: int


@dataclass(frozen=True, slots=True)
class Existing:
    """The child its key names had completed already: the step is processed with its
    output."""

    run_id: int
    output: Any


def started_child(step: StepRecord) -> int | None:
    """The child run of a waiting child step whose child runs; None for any other record."""
    if step.state != StepState.WAITING or not isinstance(step.input, dict):
        return None
    child = step.input.get(CHILD_KEY)
    return child.get("run_id") if isinstance(child, dict) else None


def child_compensation(step: StepRecord) -> tuple[int | None, bool] | None:
    """A compensation record undoing a child step: (its child run, whether the child's
    compensation started); None for any other record."""
    if step.kind != StepKind.COMPENSATION or step.agent != CHILD_AGENT:
        return None
    given = step.input if isinstance(step.input, dict) else {}
    undone = given.get("input")  # the forward step's input: {"child": {"run_id": ...}}
    child = undone.get(CHILD_KEY) if isinstance(undone, dict) else None
    run_id = child.get("run_id") if isinstance(child, dict) else None
    return run_id, bool(given.get(COMPENSATING_KEY))


def start(conn: Connection, registry: Registry | None, run: RunRecord, start: StartChild) -> Any:
    """Submit the child of `start.step` (idempotent on its key) and link it to its parent; the
    step's input names it. Returns the child's run id (it runs), `Existing` (the child its key
    names completed already: a resubmission), or the StoredError that fails the step (its
    workflow unknown, its input refused, a bound passed, the existing child failed)."""
    if registry is None:  # decided only with a registry: a guard, never taken
        return StoredError("ChildError", "no registry to submit the child run with")
    refused = _past_bounds(conn, run.id, start.step.name)
    if refused is not None:
        return refused
    [answer] = record_runs(
        conn, registry, [start.new], namespace="", actor="child", notify=False, isolate=True
    )
    if isinstance(answer, Refused):
        return StoredError("ChildRefused", f"step {start.step.name!r}: {answer.reason}")
    if not answer.created:  # made ready again (a resubmission): the child its key names
        ended = _ended_already(conn, answer.run_id, start.new.workflow)
        if ended is not None:
            return ended
    # A child of a paused parent starts paused (ops/pause.py cascades to the children).
    paused = conn.execute(select(runs.c.paused).where(runs.c.id == run.id)).scalar_one()
    conn.execute(
        update(runs)
        .where(runs.c.id == answer.run_id, runs.c.parent_run_id.is_(None))
        .values(parent_run_id=run.id, parent_step=start.step.name, paused=paused)
    )
    conn.execute(
        update(steps)
        .where(steps.c.id == start.step.id, steps.c.state == StepState.WAITING)
        .values(
            input={CHILD_KEY: {"run_id": answer.run_id, "workflow": start.new.workflow}},
            updated_at=now(),
        )
    )
    return answer.run_id


def _past_bounds(conn: Connection, run_id: int, step: str) -> StoredError | None:
    """Why run `run_id` may start no child for `step`: its parent chain is at the depth bound,
    or its other steps started as many children as a run may have (ix_runs_parent_run_id)."""
    depth = _depth(conn, run_id)
    if depth >= MAX_DEPTH:
        return StoredError(
            "ChildDepthError",
            f"step {step!r}: run {run_id} is {depth} children deep: a child would pass the "
            f"bound of {MAX_DEPTH}",
        )
    count = conn.execute(
        select(func.count())
        .select_from(runs)
        .where(runs.c.parent_run_id == run_id, runs.c.parent_step != step)
    ).scalar_one()
    if count >= MAX_CHILDREN:
        return StoredError(
            "ChildCountError", f"step {step!r}: run {run_id} has {count} children, the bound"
        )
    return None


def _ended_already(conn: Connection, child_id: int, workflow: str) -> Existing | StoredError | None:
    """The child of a step made ready again, when it ended: completed (`Existing`), or
    otherwise (the step fails); None while it is active (primary key)."""
    child = conn.execute(
        select(runs.c.state, runs.c.output, runs.c.error).where(runs.c.id == child_id)
    ).one()
    if child.state == RunState.COMPLETED:
        return Existing(child_id, child.output)
    if child.state in ACTIVE_RUN_STATES:
        return None
    return StoredError(
        "ChildFailed",
        f"child run {child_id} of {workflow} is {child.state} (resubmit it, then this run)",
        {"child_run_id": child_id, "child_error": child.error},
    )


def _depth(conn: Connection, run_id: int) -> int:
    """How many parents the run has (its parent chain, read up to one past the bound; primary
    key)."""
    depth, current = 0, run_id
    while depth <= MAX_DEPTH:
        parent = conn.execute(
            select(runs.c.parent_run_id).where(runs.c.id == current)
        ).scalar_one_or_none()
        if parent is None:
            return depth
        depth, current = depth + 1, parent
    return depth


def ended(  # noqa: PLR0917 - the run and how it ended
    conn: Connection,
    run_id: int,
    workflow: str,
    state: RunState,
    output: Any,
    error: Any,
    *,
    actor: str,
) -> tuple[int | None, list[Event]]:
    """Run `run_id` (of `workflow`) ended in `state`: when it is a child, the parent's record
    that waits for it ends too. A compensation record undoing it: processed when it is
    compensated, else in error. The forward step that started it: processed with `output`
    when it completed, else in error with the child's error. Returns the parent run to
    advance (None: no parent, or nothing of it waited) and the record's event."""
    link = conn.execute(
        select(runs.c.parent_run_id, runs.c.parent_step).where(runs.c.id == run_id)
    ).first()
    if link is None or link.parent_run_id is None:
        return None, []
    failed = StoredError(
        "ChildFailed",
        f"child run {run_id} of {workflow} ended {state}",
        {"child_run_id": run_id, "child_error": error},
    ).to_json()
    tries: list[tuple[StepKind, dict[str, Any]]] = []
    if state in {RunState.COMPENSATED, RunState.COMPENSATION_FAILED}:
        undone = state == RunState.COMPENSATED
        tries.append(
            (
                StepKind.COMPENSATION,
                {"state": StepState.PROCESSED}
                if undone
                else {"state": StepState.ERROR, "error": failed},
            )
        )
    if state == RunState.COMPLETED:
        tries.append((StepKind.FORWARD, {"state": StepState.PROCESSED, "output": output}))
    else:  # an operator's action on the child while its parent waits: the step fails
        tries.append((StepKind.FORWARD, {"state": StepState.ERROR, "error": failed}))
    for kind, values in tries:
        row = conn.execute(
            update(steps)
            .where(
                steps.c.run_id == link.parent_run_id,
                steps.c.name == link.parent_step,
                steps.c.kind == kind,
                steps.c.state == StepState.WAITING,
            )
            .values(**values, updated_at=now())
            .returning(steps.c.id)
        ).first()
        if row is not None:
            event = Event(
                run_id=link.parent_run_id,
                entity="step",
                step_id=row.id,
                step=link.parent_step,
                from_state=StepState.WAITING,
                to_state=values["state"],
                actor=actor,
                reason="child",
                detail={"child_run_id": run_id, "child_state": state},
            )
            return link.parent_run_id, [event]
    return None, []


def compensate(conn: Connection, undo: CompensateChild, *, actor: str) -> list[Event]:
    """The child run of `undo` starts compensating (it completed: its processed steps are undone
    in reverse order by its own chain); `undo`'s record waits for it. A child not completed has
    nothing of its own to undo here: the record is processed at once."""
    child = conn.execute(
        select(runs.c.state, runs.c.workflow).where(runs.c.id == undo.run_id).with_for_update()
    ).first()
    marked = {**(undo.step.input or {}), COMPENSATING_KEY: True}
    conn.execute(update(steps).where(steps.c.id == undo.step.id).values(input=marked))
    if child is None or child.state != RunState.COMPLETED:
        conn.execute(
            update(steps)
            .where(steps.c.id == undo.step.id)
            .values(state=StepState.PROCESSED, updated_at=now())
        )
        return [
            Event(
                run_id=undo.step.run_id,
                entity="step",
                step_id=undo.step.id,
                step=undo.step.name,
                from_state=StepState.WAITING,
                to_state=StepState.PROCESSED,
                actor=actor,
                reason="child not completed: nothing to undo",
                detail={"child_run_id": undo.run_id},
            )
        ]
    error = StoredError(
        "ParentCompensating",
        f"parent run {undo.step.run_id} compensates its step {undo.step.name!r}",
        {"parent_run_id": undo.step.run_id},
    ).to_json()
    conn.execute(
        update(runs)
        .where(runs.c.id == undo.run_id)
        .values(state=RunState.COMPENSATING, error=error, finished_at=None, updated_at=now())
    )
    return [
        Event(
            run_id=undo.run_id,
            entity="run",
            from_state=RunState.COMPLETED,
            to_state=RunState.COMPENSATING,
            actor=actor,
            reason="parent compensating",
            detail={"error": error},
            workflow=child.workflow,
        )
    ]


def active_children(conn: Connection, run_id: int) -> list[int]:
    """The run's children still pending or running, oldest first (ix_runs_parent_run_id)."""
    return list(
        conn.execute(
            select(runs.c.id)
            .where(runs.c.parent_run_id == run_id, runs.c.state.in_(ACTIVE_RUN_STATES))
            .order_by(runs.c.id)
        ).scalars()
    )


def children_of(conn: Connection, run_ids: Sequence[int]) -> list[int]:
    """The children of `run_ids`, any state, oldest first (ix_runs_parent_run_id)."""
    if not run_ids:
        return []
    return list(
        conn.execute(
            select(runs.c.id).where(runs.c.parent_run_id.in_(list(run_ids))).order_by(runs.c.id)
        ).scalars()
    )
