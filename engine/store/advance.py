"""Advance runs after their steps changed: make successors ready, finish or fail the run.

Callers hold the runs' row locks (see queries.lock_runs_of_steps), so two schedulers applying
the last two replies of a fan-in cannot both miss that the join step became ready.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, bindparam, update

from sasflow.errors import InvalidInputError, SasflowError
from sasflow.messages import dumps
from sasflow.registry import Registry
from sasflow.store import queries
from sasflow.store.events import Event
from sasflow.store.schema import runs, steps
from sasflow.store.sqltime import now
from sasflow.store.submit import build_step_input
from sasflow.workflow import StepContext, Workflow

ACTIVE_RUN_STATES = frozenset({"pending", "running"})
DONE_STEP_STATES = frozenset({"processed", "skipped"})


@dataclass
class Advance:
    """What advancing did: events to record and how many steps became ready."""

    events: list[Event] = field(default_factory=list)
    ready: int = 0
    finished_runs: list[int] = field(default_factory=list)


_make_ready = (
    update(steps)
    .where(steps.c.id == bindparam("b_id"), steps.c.state == "waiting")
    .values(state="pending", input=bindparam("b_input"), not_before=now(), updated_at=now())
)
_fail_waiting = (
    update(steps)
    .where(steps.c.id == bindparam("b_id"), steps.c.state == "waiting")
    .values(state="error", error=bindparam("b_error"), updated_at=now())
)
_skip = (
    update(steps)
    .where(steps.c.id == bindparam("b_id"), steps.c.state.in_(("waiting", "pending")))
    .values(state="skipped", locked_by=None, updated_at=now())
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
    conn: Connection, registry: Registry, run_ids: Iterable[int], *, actor: str
) -> Advance:
    """Bring each of `run_ids` up to date with its steps' states."""
    ids = sorted(set(run_ids))
    advancer = _Advancer(conn, registry, actor)
    if not ids:
        return advancer.result
    run_rows = {r.id: r for r in conn.execute(queries.runs_by_id(), {"b_run_ids": ids})}
    by_run: dict[int, list[Any]] = defaultdict(list)
    for row in conn.execute(queries.steps_of_runs(), {"b_run_ids": ids}):
        if row.kind == "forward":
            by_run[row.run_id].append(row)
    for run_id in ids:
        run = run_rows[run_id]
        if run.state in ACTIVE_RUN_STATES:
            advancer.advance(run, by_run[run_id])
    return advancer.result


class _Advancer:
    def __init__(self, conn: Connection, registry: Registry, actor: str) -> None:
        self.conn = conn
        self.registry = registry
        self.actor = actor
        self.result = Advance()

    def _event(self, run: Any, row: Any, from_state: str, to_state: str,
               reason: str | None = None) -> None:
        self.result.events.append(Event(run_id=run.id, entity="step", step_id=row.id,
                                        step=row.name, from_state=from_state,
                                        to_state=to_state, actor=self.actor, reason=reason))

    def advance(self, run: Any, rows: Sequence[Any]) -> None:
        state = {r.name: r.state for r in rows}
        errors = {r.name: r.error for r in rows}
        outputs = {r.name: r.output for r in rows if r.state == "processed"}
        ctx = StepContext(
            run_input=run.input, outputs=outputs, run_id=run.id, business_key=run.business_key
        )
        try:
            workflow: Workflow | None = self.registry.workflow(run.workflow, run.version)
        except SasflowError:
            workflow = None

        for row in rows:
            deps_done = all(state.get(d) == "processed" for d in row.depends_on)
            if row.state != "waiting" or not deps_done or workflow is None:
                continue
            try:
                step_input = build_step_input(workflow, row.name, ctx)
            except InvalidInputError as exc:
                error = {"type": "InvalidInputError", "message": str(exc)}
                self.conn.execute(_fail_waiting, {"b_id": row.id, "b_error": error})
                state[row.name] = "error"
                errors[row.name] = error
                self._event(run, row, "waiting", "error", str(exc))
                continue
            self.conn.execute(_make_ready, {"b_id": row.id, "b_input": step_input})
            state[row.name] = "pending"
            self.result.ready += 1
            self._event(run, row, "waiting", "pending")

        failed = [r for r in rows if state[r.name] == "error"]
        if failed:
            self._fail(run, rows, state, {"step": failed[0].name,
                                          "error": errors[failed[0].name]})
        elif workflow is None and any(s == "waiting" for s in state.values()):
            self._fail(run, rows, state, {
                "type": "UnknownWorkflowError",
                "message": f"workflow {run.workflow!r} version {run.version} is not loaded by "
                           f"{self.actor}; deploy it to every scheduler, then resubmit the run",
            })
        elif all(s in DONE_STEP_STATES for s in state.values()):
            self._complete(run, workflow, ctx)

    def _complete(self, run: Any, workflow: Workflow | None, ctx: StepContext) -> None:
        if workflow is None:
            self._finish(run, "completed", dict(ctx.outputs), None)
            return
        try:
            output = workflow.output(ctx)
            dumps(output)
        except Exception as exc:  # noqa: BLE001 - user code: reported on the run
            message = f"run output builder raised {type(exc).__name__}: {exc}"
            self._finish(run, "error", None, {"type": "InvalidOutputError", "message": message})
            return
        self._finish(run, "completed", output, None)

    def _fail(self, run: Any, rows: Sequence[Any], state: dict[str, str], error: Any) -> None:
        self._finish(run, "error", None, error)
        for row in rows:
            if state[row.name] in ("waiting", "pending"):
                if self.conn.execute(_skip, {"b_id": row.id}).rowcount != 1:
                    continue  # claimed meanwhile: its reply is applied but the run stays failed
                self._event(run, row, state[row.name], "skipped", "run failed")

    def _finish(self, run: Any, to_state: str, output: Any, error: Any) -> None:
        self.conn.execute(_finish_run, {"b_id": run.id, "b_state": to_state,
                                        "b_output": output, "b_error": error})
        self.result.finished_runs.append(run.id)
        detail = {"output": output} if to_state == "completed" else {"error": error}
        self.result.events.append(Event(run_id=run.id, entity="run", from_state=run.state,
                                        to_state=to_state, actor=self.actor, detail=detail))
