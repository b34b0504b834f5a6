"""Run deadlines (docs/timeouts.md): a run of a workflow declared with `deadline=` that has not
ended when its deadline passes (database clock) gets its `on_deadline`, once: an alert
(`run_deadline`; the run goes on), a cancellation, or a cancellation with compensation, through
the operators' own cancel (sasflow.ops.cancel), with the supervisor as the actor.
"""

from __future__ import annotations

import time

from sasflow.commands import FinishedRun
from sasflow.hooks import NO_HOOKS, Hooks
from sasflow.ops.cancel import cancel
from sasflow.states import TERMINAL_RUN_STATES, OnDeadline, RunState
from sasflow.store.cluster.lease import Lease
from sasflow.store.db import Connection, Engine, run_transaction
from sasflow.store.outbox.alerts import Alert, AlertKind, raise_alert
from sasflow.store.runs import deadlines, events
from sasflow.store.runs.sweeps import SweepReport

DEADLINE_REASON = "deadline passed"


def sweep_deadlines(
    engine: Engine,
    lease: Lease,
    *,
    batch: int,
    budget: float,
    actor: str,
    report: SweepReport,
    namespace: str,
    hooks: Hooks = NO_HOOKS,
) -> None:
    """Fire every passed deadline, `batch` runs per transaction, within `budget` seconds."""
    until = time.monotonic() + budget

    def one_batch(conn: Connection) -> int:
        lease.check(conn)
        due = deadlines.take_past_deadline(conn, batch=batch)
        deadlines.mark_fired(conn, [run.id for run in due])
        recorded: list[events.Event] = []
        finished: dict[int, FinishedRun] = {}
        for run in sorted(due, key=lambda r: r.id):
            policy = OnDeadline(run.on_deadline or OnDeadline.ALERT)
            detail = {"deadline_at": run.deadline_at.isoformat(), "on_deadline": policy.value}
            if policy is OnDeadline.ALERT:
                recorded.append(
                    events.Event(
                        run_id=run.id,
                        entity="run",
                        from_state=RunState(run.state),
                        to_state=RunState(run.state),
                        actor=actor,
                        reason=DEADLINE_REASON,
                        detail=detail,
                    )
                )
                alert_id = raise_alert(
                    conn,
                    Alert(
                        AlertKind.RUN_DEADLINE,
                        str(run.id),
                        f"run {run.id} of {run.workflow} (key {run.business_key}) has not "
                        f"ended by its deadline {run.deadline_at.isoformat()}",
                        run_id=run.id,
                        detail={**detail, "reported_by": actor},
                        workflow=run.workflow,
                    ),
                )
                if alert_id is not None:
                    report.alerts.append(alert_id)
                continue
            done = cancel(
                conn,
                run.id,
                actor=actor,
                reason=f"{DEADLINE_REASON} ({run.deadline_at.isoformat()})",
                namespace=namespace,
                compensate=policy is OnDeadline.COMPENSATE,
            )
            if done.state in TERMINAL_RUN_STATES:
                finished[run.id] = FinishedRun(RunState(done.state), run.workflow)
        events.record(conn, recorded)
        hooks.runs_finished(conn, finished)
        report.deadlines += len(due)
        return len(due)

    while run_transaction(engine, one_batch) >= batch:
        if time.monotonic() >= until:
            report.complete = False
            return
