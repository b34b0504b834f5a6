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

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, select, update

from sasflow.errors import InvalidInputError, InvalidMessageError
from sasflow.messages import dumps
from sasflow.ops.actions import InvalidActionError, close_alerts, lock_run
from sasflow.ops.runs import RunFilter
from sasflow.registry import Registry
from sasflow.store import events
from sasflow.store.notify import notify_ready
from sasflow.store.schema import runs, steps
from sasflow.store.sqltime import now
from sasflow.store.submit import build_step_input
from sasflow.workflow import StepContext

RESUBMITTABLE = frozenset({"error", "compensation_failed", "compensated", "cancelled"})
RESTART_FROM_SCRATCH = frozenset({"compensated"})


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
    from_step: str | None = None,
    new_input: Any = None,
    namespace: str = "sasflow",
) -> Resubmitted:
    """Resubmit one run inside the caller's transaction (see the module docstring)."""
    run = lock_run(conn, run_id)
    if run.state == "compensation_failed":
        if from_step is not None or new_input is not None:
            raise InvalidActionError(
                f"run {run_id} failed while compensating: resubmitting it "
                "retries the compensation (no --from-step or --input)"
            )
        return _retry_compensation(conn, run, actor=actor, reason=reason, namespace=namespace)
    if run.state not in RESUBMITTABLE and not (run.state == "completed" and from_step):
        raise InvalidActionError(
            f"run {run_id} is {run.state}: only {', '.join(sorted(RESUBMITTABLE))} runs can be "
            "resubmitted (a completed one only with --from-step)"
        )
    workflow = registry.workflow(run.workflow, run.version)
    rows = {
        r.name: r
        for r in conn.execute(
            select(steps).where(steps.c.run_id == run_id, steps.c.kind == "forward")
        )
    }
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

    outputs = {n: r.output for n, r in rows.items() if r.state == "processed" and n not in reset}
    ctx = StepContext(
        run_input=run_input, outputs=outputs, run_id=run_id, business_key=run.business_key
    )
    ready: list[str] = []
    batch: list[events.Event] = []
    for name in workflow.order:
        if name not in reset:
            continue
        row = rows[name]
        deps_done = all(d in outputs for d in row.depends_on)
        step_input = build_step_input(workflow, name, ctx) if deps_done else None
        to_state = "pending" if deps_done else "waiting"
        conn.execute(
            update(steps)
            .where(steps.c.id == row.id)
            .values(
                state=to_state,
                input=step_input,
                output=None,
                error=None,
                failure_count=0,
                locked_by=None,
                complete_by=None,
                deferred_since=None,
                not_before=now(),
                idempotency_key=row.idempotency_key if _outcome_unknown(row) else uuid.uuid4().hex,
                updated_at=now(),
            )
        )
        if deps_done:
            ready.append(name)
        batch.append(
            events.Event(
                run_id=run_id,
                entity="step",
                step_id=row.id,
                step=name,
                from_state=row.state,
                to_state=to_state,
                actor=actor,
                reason=f"resubmitted: {reason}",
            )
        )
    # A new forward attempt: a previous compensation chain is history (kept in events).
    conn.execute(delete(steps).where(steps.c.run_id == run_id, steps.c.kind == "compensation"))
    conn.execute(
        update(runs)
        .where(runs.c.id == run_id)
        .values(
            state="running",
            input=run_input,
            output=None,
            error=None,
            finished_at=None,
            updated_at=now(),
        )
    )
    detail: dict[str, Any] = {"reset": sorted(reset), "from_step": from_step}
    if new_input is not None:
        detail["previous_input"] = run.input
    batch.insert(
        0,
        events.Event(
            run_id=run_id,
            entity="run",
            from_state=run.state,
            to_state="running",
            actor=actor,
            reason=f"resubmitted: {reason}",
            detail=detail,
        ),
    )
    events.record(conn, batch)
    close_alerts(conn, run_id, actor=actor, reason=f"run resubmitted: {reason}")
    notify_ready(conn, namespace)
    return Resubmitted(run_id, tuple(n for n in workflow.order if n in reset), tuple(ready))


def _outcome_unknown(row: Any) -> bool:
    """The step never got a definite answer: it ran out of failures (timeouts, transient
    errors), or never ran, or was cancelled in flight."""
    if row.state == "processed":
        return False
    return not (row.state == "error" and row.failure_count < row.max_failures)


def _retry_compensation(
    conn: Connection, run: Any, *, actor: str, reason: str, namespace: str
) -> Resubmitted:
    chain = list(
        conn.execute(
            select(steps)
            .where(steps.c.run_id == run.id, steps.c.kind == "compensation")
            .order_by(steps.c.id)
        )
    )
    done = {r.name for r in chain if r.state == "processed"}
    batch: list[events.Event] = []
    reset: list[str] = []
    ready: list[str] = []
    for row in chain:
        if row.state not in ("error", "skipped"):
            continue
        deps_done = all(d in done for d in row.depends_on)
        to_state = "pending" if deps_done else "waiting"
        conn.execute(
            update(steps)
            .where(steps.c.id == row.id)
            .values(
                state=to_state,
                error=None,
                failure_count=0,
                locked_by=None,
                complete_by=None,
                deferred_since=None,
                not_before=now(),
                idempotency_key=row.idempotency_key if _outcome_unknown(row) else uuid.uuid4().hex,
                updated_at=now(),
            )
        )
        reset.append(row.name)
        if deps_done:
            ready.append(row.name)
        batch.append(
            events.Event(
                run_id=run.id,
                entity="step",
                step_id=row.id,
                step=row.name,
                from_state=row.state,
                to_state=to_state,
                actor=actor,
                reason=f"compensation resubmitted: {reason}",
                detail={"kind": "compensation"},
            )
        )
    if not reset:
        raise InvalidActionError(f"run {run.id} has no failed compensation step")
    conn.execute(
        update(runs)
        .where(runs.c.id == run.id)
        .values(state="compensating", finished_at=None, updated_at=now())
    )
    batch.insert(
        0,
        events.Event(
            run_id=run.id,
            entity="run",
            from_state=run.state,
            to_state="compensating",
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
    if state in RESTART_FROM_SCRATCH:
        return set(rows)  # their effects were undone: everything runs again
    if from_step is not None:
        reset, todo = set(), [from_step]
        while todo:
            name = todo.pop()
            if name not in reset:
                reset.add(name)
                todo.extend(successors.get(name, ()))
        return reset | {n for n, r in rows.items() if r.state != "processed"}
    if state in RESTART_FROM_SCRATCH:
        return set(rows)
    return {n for n, r in rows.items() if r.state != "processed"}


def select_runs(conn: Connection, where: RunFilter) -> list[int]:
    """The ids a bulk action would touch, oldest first (what --dry-run prints)."""
    query = (
        select(runs.c.id)
        .where(*where.conditions())
        .order_by(runs.c.created_at, runs.c.id)
        .limit(where.limit)
    )
    return list(conn.execute(query).scalars())


def resubmit_many(
    conn: Connection,
    registry: Registry,
    where: RunFilter,
    *,
    actor: str,
    reason: str,
    dry_run: bool,
    namespace: str = "sasflow",
) -> list[int]:
    """Resubmit every run `where` selects (default: from their failed steps); with `dry_run`
    only say which."""
    if not where.states:
        where = RunFilter(
            states=("error",),
            workflow=where.workflow,
            key=where.key,
            since=where.since,
            until=where.until,
            limit=where.limit,
        )
    ids = select_runs(conn, where)
    if not dry_run:
        for run_id in ids:
            resubmit(conn, registry, run_id, actor=actor, reason=reason, namespace=namespace)
    return ids
