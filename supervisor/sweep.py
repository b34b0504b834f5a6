"""One supervisor sweep: count the failures of expired steps, escalate, flag stalled work.

The supervisor holds no business logic: it decides only "this attempt failed" (the step goes
back to pending after a backoff, or to error at its threshold); what a failed run then does
(error and an alert, or compensation) is the run's own policy, applied by `advance_runs`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from sasflow.commands import StoredError
from sasflow.errors import InvalidMessageError
from sasflow.hooks import NO_HOOKS, Hooks
from sasflow.messages import Fence, parse
from sasflow.states import StepState
from sasflow.store.cluster.lease import Lease
from sasflow.store.db import Connection, Engine, run_transaction, transaction
from sasflow.store.notify import notify_ready
from sasflow.store.outbox.alerts import STALLED, Alert, raise_alert
from sasflow.store.runs import events, sweeps
from sasflow.store.runs.advance import advance_runs
from sasflow.store.runs.sweeps import SweepReport
from sasflow.transport.base import Delivery
from sasflow.transport.topology import REASON_HEADER

log = logging.getLogger(__name__)

TIMEOUT_ERROR = StoredError("Timeout", "no reply before the step's deadline").to_json()


def sweep_expired(
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
    """Count a failure for every expired step, `batch` at a time, within `budget` seconds.

    Each batch locks the runs of its expired steps first (as schedulers applying replies do),
    skipping runs another transaction holds: they are swept next time."""
    deadline = time.monotonic() + budget

    def one_batch(conn: Connection) -> int:
        lease.check(conn)
        expired = sweeps.expired_runs(conn, batch=batch)
        if not expired:
            return 0
        runs_of_expired = sorted(set(expired))  # several expired steps may share a run
        locked = sweeps.lock_runs(conn, runs_of_expired, skip_locked=True)
        rows = sweeps.count_expired(conn, locked, error=TIMEOUT_ERROR) if locked else []
        _record(conn, rows, "expired", actor=actor, report=report, namespace=namespace, hooks=hooks)
        return len(expired)  # a full batch of expired steps: there may be more

    while run_transaction(engine, one_batch) >= batch:
        if time.monotonic() >= deadline:
            report.complete = False
            return


def count_dead_requests(
    engine: Engine,
    lease: Lease,
    deliveries: Iterable[Delivery],
    *,
    actor: str,
    report: SweepReport,
    namespace: str,
    hooks: Hooks = NO_HOOKS,
) -> None:
    """Requests that were dead-lettered (rejected by an agent, or expired unconsumed) provably
    did not produce a reply for their attempt: count the failure now, fenced by the attempt."""
    failures: list[tuple[int, int, str]] = []
    for delivery in deliveries:
        fence = _fence_of(delivery)
        if fence is not None:
            failures.append(fence)
    if not failures:
        return

    def count(conn: Connection) -> None:
        lease.check(conn)
        run_ids = sweeps.runs_of(conn, [f[0] for f in failures])
        sweeps.lock_runs(conn, run_ids, skip_locked=False)
        rows = []
        for step_id, attempt, reason in failures:
            error = StoredError("RequestDeadLettered", reason).to_json()
            row = sweeps.count_failure(conn, step_id=step_id, attempt=attempt, error=error)
            if row is not None:
                rows.append(row)
        report.dead_requests += len(rows)
        _record(
            conn,
            rows,
            "request dead-lettered",
            actor=actor,
            report=report,
            namespace=namespace,
            hooks=hooks,
        )

    run_transaction(engine, count)


def _fence_of(delivery: Delivery) -> tuple[int, int, str] | None:
    """The (step id, attempt, reason) a dead-lettered request names, or None (`Fence`: not a
    whole `Request`, since an agent dead-letters precisely the requests that fail to parse as
    one, and those too never reply)."""
    try:
        fence = parse(Fence, delivery.body)
    except InvalidMessageError:
        return None  # not provably a request of ours: the operator's copy stays in <ns>.dead
    reason = delivery.headers.get(REASON_HEADER)
    if reason is None:
        deaths = delivery.headers.get("x-death") or [{}]
        reason = f"broker dead-lettered the request ({deaths[0].get('reason', 'unknown')})"
    return fence.step_id, fence.attempt, str(reason)


def _record(
    conn: Connection,
    rows: Sequence[Any],
    reason: str,
    *,
    actor: str,
    report: SweepReport,
    namespace: str,
    hooks: Hooks,
) -> None:
    hooks.steps_expired(conn, rows, reason)
    batch = [
        events.step_event(
            r,
            StepState.PROCESSING,
            r.state,
            attempt=r.attempt,
            actor=actor,
            reason=reason,
            detail={"failure_count": r.failure_count, "not_before": r.not_before.isoformat()},
        )
        for r in rows
    ]
    reclaimed = sum(1 for r in rows if r.state == StepState.PENDING)
    report.reclaimed += reclaimed
    report.escalated += sum(1 for r in rows if r.state == StepState.ERROR)
    ready = 0
    failed_runs = {r.run_id for r in rows if r.state == StepState.ERROR}
    if failed_runs:
        advanced = advance_runs(conn, None, failed_runs, actor=actor)
        hooks.runs_finished(conn, events.finished_runs(advanced.events))
        batch.extend(advanced.events)
        report.alerts.extend(advanced.alerts)
        report.compensations += advanced.compensations
        ready = advanced.ready
    if ready or reclaimed:
        # Reclaimed steps are ready after their backoff: woken schedulers learn when.
        notify_ready(conn, namespace)
    events.record(conn, batch)


def flag_stalled(
    engine: Engine, lease: Lease, *, stalled_after: float, actor: str, report: SweepReport
) -> None:
    """Raise one `stalled` alert per agent whose ready steps nobody claimed for too long
    (no scheduler alive, or none that can reach the broker)."""
    with transaction(engine) as conn:  # inserts alerts only: no lock on steps or runs
        lease.check(conn)
        for row in sweeps.stalled_agents(conn, stalled_after=stalled_after):
            message = (
                f"{row.steps} ready step(s) for agent {row.agent!r} have not been claimed "
                f"since {row.since.isoformat()}: is a scheduler running?"
            )
            alert_id = raise_alert(
                conn,
                Alert(
                    STALLED,
                    row.agent,
                    message,
                    detail={
                        "agent": row.agent,
                        "steps": row.steps,
                        "since": row.since.isoformat(),
                        "reported_by": actor,
                    },
                ),
            )
            if alert_id is not None:
                report.alerts.append(alert_id)
