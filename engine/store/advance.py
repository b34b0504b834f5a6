"""Advance runs after their steps changed: make successors ready, finish the run, or apply its
failure policy (error and an alert, or compensation).

Callers hold the runs' row locks (see queries.lock_runs_of_steps), so two schedulers applying
the last two replies of a fan-in cannot both miss that the join step became ready.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, Row, bindparam, update

from sasflow.errors import InvalidInputError, SasflowError
from sasflow.messages import dumps
from sasflow.registry import Registry
from sasflow.states import (
    ACTIVE_RUN_STATES,
    DONE_STEP_STATES,
    NOT_STARTED_STEP_STATES,
    OnFailure,
    RunState,
    StepKind,
    StepState,
)
from sasflow.store import queries
from sasflow.store.alerts import COMPENSATION_FAILED, STEP_FAILED, Alert, raise_alert
from sasflow.store.commands import StoredError
from sasflow.store.compensation import create_chain
from sasflow.store.events import Event, step_event
from sasflow.store.schema import runs, steps
from sasflow.store.sqltime import now
from sasflow.store.submit import build_step_input
from sasflow.workflow import StepContext, Workflow


@dataclass
class Advance:
    """What advancing did: events to record, steps made ready, alerts raised."""

    events: list[Event] = field(default_factory=list)
    ready: int = 0
    alerts: list[int] = field(default_factory=list)
    compensations: int = 0


_make_ready = (
    update(steps)
    .where(steps.c.id == bindparam("b_id"), steps.c.state == StepState.WAITING)
    .values(state=StepState.PENDING, input=bindparam("b_input"), not_before=now(), updated_at=now())
)
_release_waiting = (
    update(steps)
    .where(steps.c.id == bindparam("b_id"), steps.c.state == StepState.WAITING)
    .values(state=StepState.PENDING, not_before=now(), updated_at=now())
)
_fail_waiting = (
    update(steps)
    .where(steps.c.id == bindparam("b_id"), steps.c.state == StepState.WAITING)
    .values(state=StepState.ERROR, error=bindparam("b_error"), updated_at=now())
)
_skip = (
    update(steps)
    .where(steps.c.id == bindparam("b_id"), steps.c.state.in_(NOT_STARTED_STEP_STATES))
    .values(state=StepState.SKIPPED, locked_by=None, updated_at=now())
)
_set_run_state = (
    update(runs)
    .where(runs.c.id == bindparam("b_id"))
    .values(state=bindparam("b_state"), error=bindparam("b_error"), updated_at=now())
)
_finish_run = (
    update(runs)
    .where(runs.c.id == bindparam("b_id"))
    .values(
        state=bindparam("b_state"),
        output=bindparam("b_output"),
        error=bindparam("b_error"),
        updated_at=now(),
        finished_at=now(),
    )
)


def advance_runs(
    conn: Connection,
    registry: Registry | None,
    run_ids: Iterable[int],
    *,
    actor: str,
    locked: Iterable[Row[Any]] | None = None,
) -> Advance:
    """Bring each of `run_ids` up to date with its steps' states.

    `locked`: rows of queries.lock_runs_of_steps that the caller read in this transaction, under
    the runs' locks (a superset of `run_ids` is fine); without them the runs are locked and
    read here. Without a registry (the supervisor) no step input can be built: only failures
    and compensation are handled, which need nothing but the stored rows.
    """
    ids = sorted(set(run_ids))
    advancer = _Advancer(conn, registry, actor)
    if not ids:
        return advancer.result
    if locked is None:
        locked = conn.execute(queries.runs_by_id(), {"b_run_ids": ids})
    wanted = set(ids)
    # Mutable copies: advancing a run updates the states it reasons about as it goes.
    run_rows = {r.id: SimpleNamespace(**r._asdict()) for r in locked if r.id in wanted}
    by_run: dict[int, list[Any]] = defaultdict(list)
    for row in conn.execute(queries.steps_of_runs(), {"b_run_ids": ids}):
        by_run[row.run_id].append(SimpleNamespace(**row._asdict()))
    for run_id in ids:
        run = run_rows[run_id]
        forward = [r for r in by_run[run_id] if r.kind == StepKind.FORWARD]
        if run.state in ACTIVE_RUN_STATES:
            advancer.advance(run, forward)
        elif run.state == RunState.COMPENSATING:
            compensation = [r for r in by_run[run_id] if r.kind == StepKind.COMPENSATION]
            advancer.compensate(run, forward, compensation)
    return advancer.result


class _Advancer:
    def __init__(self, conn: Connection, registry: Registry | None, actor: str) -> None:
        self.conn = conn
        self.registry = registry
        self.actor = actor
        self.result = Advance()

    def _event(
        self, row: Any, from_state: StepState, to_state: StepState, reason: str | None = None
    ) -> None:
        self.result.events.append(
            step_event(row, from_state, to_state, actor=self.actor, reason=reason)
        )

    def _run_event(
        self,
        run: Any,
        from_state: RunState,
        to_state: RunState,
        detail: Any,
        reason: str | None = None,
    ) -> None:
        self.result.events.append(
            Event(
                run_id=run.id,
                entity="run",
                from_state=from_state,
                to_state=to_state,
                actor=self.actor,
                detail=detail,
                reason=reason,
            )
        )

    # -- the forward flow -------------------------------------------------------------------

    def advance(self, run: Any, rows: Sequence[Any]) -> None:
        state = {r.name: StepState(r.state) for r in rows}
        errors = {r.name: r.error for r in rows}
        outputs = {r.name: r.output for r in rows if r.state == StepState.PROCESSED}
        ctx = StepContext(
            run_input=run.input, outputs=outputs, run_id=run.id, business_key=run.business_key
        )
        workflow: Workflow | None = None
        if self.registry is not None:
            try:
                workflow = self.registry.workflow(run.workflow, run.version)
            except SasflowError:
                workflow = None

        for row in rows:
            deps_done = all(state.get(d) == StepState.PROCESSED for d in row.depends_on)
            if row.state != StepState.WAITING or not deps_done or workflow is None:
                continue
            try:
                step_input = build_step_input(workflow, row.name, ctx)
            except InvalidInputError as exc:
                error = StoredError("InvalidInputError", str(exc)).to_json()
                self.conn.execute(_fail_waiting, {"b_id": row.id, "b_error": error})
                state[row.name] = StepState.ERROR
                errors[row.name] = error
                self._event(row, StepState.WAITING, StepState.ERROR, str(exc))
                continue
            self.conn.execute(_make_ready, {"b_id": row.id, "b_input": step_input})
            state[row.name] = StepState.PENDING
            self.result.ready += 1
            self._event(row, StepState.WAITING, StepState.PENDING)

        failed = [r for r in rows if state[r.name] == StepState.ERROR]
        if failed:
            first = failed[0]
            self._failed(run, rows, state, first, {"step": first.name, "error": errors[first.name]})
        elif self.registry is not None and workflow is None:
            self._failed(
                run,
                rows,
                state,
                None,
                StoredError(
                    "UnknownWorkflowError",
                    f"workflow {run.workflow!r} version {run.version} is not loaded by "
                    f"{self.actor}; deploy it to every scheduler, then resubmit the run",
                ).to_json(),
            )
        elif all(s in DONE_STEP_STATES for s in state.values()):
            self._complete(run, rows, state, workflow, ctx)

    def _complete(
        self,
        run: Any,
        rows: Sequence[Any],
        state: dict[str, StepState],
        workflow: Workflow | None,
        ctx: StepContext,
    ) -> None:
        if workflow is None:
            self._finish(run, RunState.COMPLETED, dict(ctx.outputs), None)
            return
        try:
            output = workflow.output(ctx)
            dumps(output)
        except Exception as exc:  # noqa: BLE001 - user code: the run's failure policy applies
            message = f"run output builder raised {type(exc).__name__}: {exc}"
            error = StoredError("InvalidOutputError", message).to_json()
            self._failed(run, rows, state, None, error)
            return
        self._finish(run, RunState.COMPLETED, output, None)

    def _failed(
        self, run: Any, rows: Sequence[Any], state: dict[str, StepState], step: Any, error: Any
    ) -> None:
        """Apply the run's failure policy: compensation, or error and an alert."""
        compensating = run.on_failure == OnFailure.COMPENSATE
        for row in rows:
            if state[row.name] not in NOT_STARTED_STEP_STATES:
                continue
            if compensating and _in_flight(row.kind, state[row.name], row.attempt):
                continue  # a retry of an attempt with unknown outcome: it must finish first
            if self.conn.execute(_skip, {"b_id": row.id}).rowcount != 1:
                state[row.name] = StepState.PROCESSING  # claimed meanwhile: in flight
                continue
            self._event(row, state[row.name], StepState.SKIPPED, "run failed")
            state[row.name] = StepState.SKIPPED
        if compensating:
            self.conn.execute(
                _set_run_state, {"b_id": run.id, "b_state": RunState.COMPENSATING, "b_error": error}
            )
            self._run_event(run, run.state, RunState.COMPENSATING, {"error": error}, "step failed")
            self.result.compensations += 1
            run.state, run.error = RunState.COMPENSATING, error
            for row in rows:
                row.state = state[row.name]
            self.compensate(run, rows, [])
            return
        self._finish(run, RunState.ERROR, None, error)
        where = f"step {step.name!r}" if step is not None else "the run level"
        message = (
            f"run {run.id} of {run.workflow} (key {run.business_key}) failed at {where}: "
            f"{_describe(error)}"
        )
        subject = str(step.id) if step is not None else f"run-{run.id}"
        alert_id = raise_alert(
            self.conn,
            Alert(
                STEP_FAILED,
                subject,
                message,
                run_id=run.id,
                step_id=step.id if step is not None else None,
                detail=error,
            ),
        )
        if alert_id is not None:
            self.result.alerts.append(alert_id)

    def _finish(self, run: Any, to_state: RunState, output: Any, error: Any) -> None:
        self.conn.execute(
            _finish_run, {"b_id": run.id, "b_state": to_state, "b_output": output, "b_error": error}
        )
        detail = {"output": output} if to_state == RunState.COMPLETED else {"error": error}
        self._run_event(run, run.state, to_state, detail)

    # -- compensation ---------------------------------------------------------------------

    def compensate(self, run: Any, forward: Sequence[Any], chain: Sequence[Any]) -> None:
        """Advance a `compensating` run: wait for in-flight steps, create the chain, release
        its next step, and end in `compensated` or `compensation_failed`."""
        if any(_in_flight(r.kind, r.state, r.attempt) for r in forward):
            return  # an in-flight step may still succeed: it must be undone too
        if not chain:
            created = create_chain(self.conn, run, forward)
            if not created:
                self._finish(run, RunState.COMPENSATED, None, run.error)
                return
            for row in created:
                self.result.events.append(
                    Event(
                        run_id=run.id,
                        entity="step",
                        step_id=row["id"],
                        step=row["name"],
                        from_state=None,
                        to_state=row["state"],
                        actor=self.actor,
                        reason="compensation",
                        detail={"kind": StepKind.COMPENSATION, "action": row["action"]},
                    )
                )
            self.result.ready += 1
            return
        state = {r.name: StepState(r.state) for r in chain}
        failed = [r for r in chain if r.state == StepState.ERROR]
        if failed:
            step = failed[0]
            for row in chain:
                if (
                    row.state in NOT_STARTED_STEP_STATES
                    and self.conn.execute(_skip, {"b_id": row.id}).rowcount == 1
                ):
                    self._event(row, row.state, StepState.SKIPPED, "compensation failed")
            error = {"step": step.name, "compensation": True, "error": step.error}
            self._finish(run, RunState.COMPENSATION_FAILED, None, error)
            message = (
                f"run {run.id} of {run.workflow} (key {run.business_key}): compensating "
                f"step {step.name!r} failed ({_describe(step.error)}); the run needs an "
                "operator"
            )
            alert_id = raise_alert(
                self.conn,
                Alert(
                    COMPENSATION_FAILED,
                    str(step.id),
                    message,
                    run_id=run.id,
                    step_id=step.id,
                    detail=error,
                ),
            )
            if alert_id is not None:
                self.result.alerts.append(alert_id)
            return
        if all(s == StepState.PROCESSED for s in state.values()):
            self._finish(run, RunState.COMPENSATED, None, run.error)  # keep why it was compensated
            return
        for row in chain:
            if row.state == StepState.WAITING and all(
                state.get(d) == StepState.PROCESSED for d in row.depends_on
            ):
                self.conn.execute(_release_waiting, {"b_id": row.id})
                self.result.ready += 1
                self._event(row, StepState.WAITING, StepState.PENDING, "compensation")


def _in_flight(kind: str, state: str, attempt: int) -> bool:
    """Processing, or a forward step waiting to retry an attempt whose outcome is unknown."""
    return state == StepState.PROCESSING or (
        kind == StepKind.FORWARD and state == StepState.PENDING and attempt > 0
    )


def _describe(error: Any) -> str:
    if isinstance(error, dict):
        inner = error.get("error", error)
        if isinstance(inner, dict) and "message" in inner:
            return f"{inner.get('type', 'Error')}: {inner['message']}"
    return str(error)
