"""Operator resubmission (the pattern's manual recovery): run a failed run again.

By default the run restarts from its failed steps: every forward step that is not processed is
reset (failure count 0, error and output cleared) and the ones whose dependencies are processed
become ready. `from_step` also re-runs that step and everything after it. A corrected input
replaces the run's input (the old one stays in the history). Compensated runs restart from
their first step, since their effects were undone. A run whose compensation failed retries its
compensation: the failed and skipped compensation steps run again.

Idempotency keys: a step re-run on purpose (processed before) or one the remote service
answered with a permanent error gets a fresh key, so the service does not replay its cached
answer; a step whose outcome is unknown (it exhausted its retries on timeouts or transient
errors) keeps its key, so a remote that did the work once can deduplicate it. Attempt numbers
keep growing, so a late reply of an attempt from before the resubmission is fenced out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sasflow.errors import InvalidActionError, InvalidInputError, InvalidMessageError
from sasflow.messages import dumps
from sasflow.ops.actions import close_alerts, lock_run
from sasflow.registry import Registry
from sasflow.states import (
    RESTART_FROM_SCRATCH_RUN_STATES,
    RESUBMITTABLE_RUN_STATES,
    RunState,
    StepKind,
    StepState,
)
from sasflow.store.db import Connection, rehearse
from sasflow.store.notify import notify_ready
from sasflow.store.operator import inspect
from sasflow.store.operator import transitions as operator
from sasflow.store.operator.inspect import RunFilter
from sasflow.store.operator.transitions import StepReset
from sasflow.store.runs import events
from sasflow.store.runs.step_rows import new_idempotency_key
from sasflow.store.runs.submit import build_step_input
from sasflow.workflow import StepContext, Workflow


@dataclass(frozen=True)
class Resubmitted:
    run_id: int
    reset_steps: tuple[str, ...]
    ready_steps: tuple[str, ...]


def resubmit(
    conn: Connection,
    registry: Registry,
    run_id: int,
    *,
    actor: str,
    reason: str,
    namespace: str,
    from_step: str | None = None,
    new_input: Any = None,
) -> Resubmitted:
    """Resubmit one run inside the caller's transaction (see the module docstring)."""
    run = lock_run(conn, run_id)
    if run.state == RunState.COMPENSATION_FAILED:
        if from_step is not None or new_input is not None:
            raise InvalidActionError(
                f"run {run_id} failed while compensating: resubmitting it "
                "retries the compensation (no --from-step or --input)"
            )
        return _retry_compensation(conn, run, actor=actor, reason=reason, namespace=namespace)
    if run.state not in RESUBMITTABLE_RUN_STATES and not (
        run.state == RunState.COMPLETED and from_step
    ):
        raise InvalidActionError(
            f"run {run_id} is {run.state}: only {', '.join(sorted(RESUBMITTABLE_RUN_STATES))} "
            "runs can be resubmitted (a completed one only with --from-step)"
        )
    workflow = registry.workflow(run.workflow, run.version)
    # A map's items are not steps of the workflow: the map decides for them.
    rows = {r.name: r for r in operator.forward_steps(conn, run_id) if r.map_parent is None}
    run_input = run.input
    if new_input is not None:
        try:
            dumps(new_input)
        except InvalidMessageError as exc:
            raise InvalidInputError(f"corrected input: {exc}") from exc
        run_input = new_input
    reset = _steps_to_reset(run.state, rows, workflow.successors, from_step)
    if not reset:
        raise InvalidActionError(f"run {run_id} has no step to run again")

    outputs = {
        n: r.output for n, r in rows.items() if r.state == StepState.PROCESSED and n not in reset
    }
    ctx = StepContext(
        run_input=run_input, outputs=outputs, run_id=run_id, business_key=run.business_key
    )
    resets, ready, maps, later = _resets(workflow, reset, rows, ctx)
    batch = [
        _step_event(rows[name], r, actor=actor, reason=f"resubmitted: {reason}")
        for name, r in resets
    ]
    operator.reset_steps(conn, [r for _, r in resets])
    operator.delete_map_items(conn, run_id, maps)
    if later:
        operator.advance_later(conn, run_id)
    # A new forward attempt: a previous compensation chain is history (kept in events).
    operator.delete_compensation_chain(conn, run_id)
    operator.restart_run(conn, run_id, run_input=run_input)
    detail: dict[str, Any] = {"reset": sorted(reset), "from_step": from_step}
    if new_input is not None:
        detail["previous_input"] = run.input
    batch.insert(
        0,
        events.Event(
            run_id=run_id,
            entity="run",
            from_state=run.state,
            to_state=RunState.RUNNING,
            actor=actor,
            reason=f"resubmitted: {reason}",
            detail=detail,
        ),
    )
    events.record(conn, batch)
    close_alerts(conn, run_id, actor=actor, reason=f"run resubmitted: {reason}")
    notify_ready(conn, namespace)
    return Resubmitted(run_id, tuple(n for n in workflow.order if n in reset), tuple(ready))


def _resets(
    workflow: Workflow, reset: set[str], rows: dict[str, Any], ctx: StepContext
) -> tuple[list[tuple[str, StepReset]], list[str], list[int], bool]:
    """How the steps `reset` run again, in the workflow's order; the ones ready now; the maps
    among them; whether a scheduler's advance duty must make some ready. A map runs over its
    list again, all its items anew: it waits (never pending) for that duty to create them
    (docs/concepts.md, "Map steps"); a child step waits for it the same way, to submit its
    child (the same child, by its key: "Child workflows")."""
    resets: list[tuple[str, StepReset]] = []
    ready: list[str] = []
    maps: list[int] = []
    later = False
    for name in workflow.order:
        if name not in reset:
            continue
        row = rows[name]
        deps_done = all(d in ctx.outputs for d in row.depends_on)
        definition = workflow.step(name)
        if definition.map_spec is not None or definition.child_spec is not None:
            if definition.map_spec is not None:
                maps.append(row.id)
            later = True
            resets.append((name, dataclasses.replace(_reset(row, False), input=None)))
            continue
        step_input = build_step_input(workflow, name, ctx) if deps_done else None
        resets.append((name, _reset(row, deps_done, step_input)))
        if deps_done:
            ready.append(name)
    return resets, ready, maps, later


def _reset(row: Any, deps_done: bool, step_input: Any = None) -> StepReset:
    """How `row` runs again: pending when its dependencies are processed, else waiting; with a
    fresh idempotency key unless its earlier outcome is unknown."""
    return StepReset(
        step_id=row.id,
        kind=StepKind(row.kind),
        to_state=StepState.PENDING if deps_done else StepState.WAITING,
        idempotency_key=row.idempotency_key if _outcome_unknown(row) else new_idempotency_key(),
        input=step_input,
    )


def _step_event(
    row: Any, reset: StepReset, *, actor: str, reason: str, detail: Any = None
) -> events.Event:
    return events.step_event(
        row, row.state, reset.to_state, actor=actor, reason=reason, detail=detail
    )


def _outcome_unknown(row: Any) -> bool:
    """The step never got a definite answer: it ran out of failures (timeouts, transient
    errors), or never ran, or was cancelled in flight."""
    if row.state == StepState.PROCESSED:
        return False
    return not (row.state == StepState.ERROR and row.failure_count < row.max_failures)


def _retry_compensation(
    conn: Connection, run: Any, *, actor: str, reason: str, namespace: str
) -> Resubmitted:
    chain = operator.compensation_chain(conn, run.id)
    done = {r.name for r in chain if r.state == StepState.PROCESSED}
    batch: list[events.Event] = []
    resets: list[StepReset] = []
    reset: list[str] = []
    ready: list[str] = []
    for row in chain:
        if row.state not in (StepState.ERROR, StepState.SKIPPED):
            continue
        deps_done = all(d in done for d in row.depends_on)
        resets.append(_reset(row, deps_done))
        reset.append(row.name)
        if deps_done:
            ready.append(row.name)
        batch.append(
            _step_event(
                row,
                resets[-1],
                actor=actor,
                reason=f"compensation resubmitted: {reason}",
                detail={"kind": StepKind.COMPENSATION},
            )
        )
    if not reset:
        raise InvalidActionError(f"run {run.id} has no failed compensation step")
    operator.reset_steps(conn, resets)
    operator.restart_compensation(conn, run.id)
    batch.insert(
        0,
        events.Event(
            run_id=run.id,
            entity="run",
            from_state=run.state,
            to_state=RunState.COMPENSATING,
            actor=actor,
            reason=f"resubmitted: {reason}",
            detail={"reset": reset, "compensation": True},
        ),
    )
    events.record(conn, batch)
    close_alerts(conn, run.id, actor=actor, reason=f"run resubmitted: {reason}")
    notify_ready(conn, namespace)
    return Resubmitted(run.id, tuple(reset), tuple(ready))


def _steps_to_reset(
    state: str, rows: dict[str, Any], successors: dict[str, tuple[str, ...]], from_step: str | None
) -> set[str]:
    if from_step is not None and from_step not in rows:
        raise InvalidActionError(f"the run has no step {from_step!r} (it has: {', '.join(rows)})")
    if state in RESTART_FROM_SCRATCH_RUN_STATES:
        return set(rows)  # their effects were undone: everything runs again
    not_processed = {n for n, r in rows.items() if r.state != StepState.PROCESSED}
    if from_step is None:
        return not_processed
    reset, todo = set(), [from_step]
    while todo:
        name = todo.pop()
        if name not in reset:
            reset.add(name)
            todo.extend(successors.get(name, ()))
    return reset | not_processed


def select_runs(conn: Connection, where: RunFilter) -> list[int]:
    """The ids a bulk action would touch, oldest first (what --dry-run prints)."""
    return inspect.select_run_ids(conn, where)


def resubmit_many(
    conn: Connection,
    registry: Registry,
    where: RunFilter,
    *,
    actor: str,
    reason: str,
    dry_run: bool,
    namespace: str,
) -> list[Resubmitted]:
    """Resubmit every run `where` selects (default: those in error, from their failed steps),
    oldest first; with `dry_run` the same resubmissions are made and rolled back, so the
    preview names exactly the runs and steps the real action redoes."""
    if not where.states:
        where = dataclasses.replace(where, states=(RunState.ERROR,))

    def work(conn: Connection) -> list[Resubmitted]:
        return [
            resubmit(conn, registry, run_id, actor=actor, reason=reason, namespace=namespace)
            for run_id in select_runs(conn, where)
        ]

    return rehearse(conn, work) if dry_run else work(conn)
