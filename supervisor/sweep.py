"""One supervisor sweep: find the expired steps, tell their clocks apart, charge the party
whose clock ran out, escalate, flag stalled work.

The supervisor holds no business logic: it decides only "this attempt failed" (the step goes
back to pending after a backoff, or to error at its threshold) or "no agent took this
attempt" (back to pending, no failure counted: sasflow.supervisor.clocks); what a failed run
then does (error and an alert, or compensation) is the run's own policy, applied by
`advance_runs`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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
from sasflow.store.runs.parked import raise_parked_alerts
from sasflow.store.runs.sweeps import SweepReport
from sasflow.supervisor import clocks
from sasflow.transport.base import Delivery
from sasflow.transport.topology import REASON_HEADER

log = logging.getLogger(__name__)

NOT_TAKEN = frozenset({"expired", "maxlen"})
"""x-death reasons of a request the broker dropped before any agent took it (the wait clock):
no failure counted. Any other (an agent rejected it) counts one."""


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
    """Record the expiry of every expired step, `batch` at a time, within `budget` seconds:
    a failure counted for the execution and heartbeat clocks, none for the wait clock.

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
        found = sweeps.take_expired(conn, locked) if locked else []
        # One statement per distinct error (a handful: one per clock and timeout value).
        groups: dict[tuple[bool, str], tuple[clocks.Expiry, list[int]]] = {}
        for step in found:
            expiry = clocks.expired(step)
            key = (expiry.charged, expiry.error.message)
            groups.setdefault(key, (expiry, []))[1].append(step.id)
        for expiry, ids in groups.values():
            _record_expiry(
                conn,
                expiry,
                ids,
                actor=actor,
                report=report,
                namespace=namespace,
                hooks=hooks,
            )
        return len(expired)  # a full batch of expired steps: there may be more

    while run_transaction(engine, one_batch) >= batch:
        if time.monotonic() >= deadline:
            report.complete = False
            return


def _record_expiry(
    conn: Connection,
    expiry: clocks.Expiry,
    step_ids: list[int],
    *,
    actor: str,
    report: SweepReport,
    namespace: str,
    hooks: Hooks,
) -> None:
    error = expiry.error.to_json()
    if expiry.charged:
        rows = sweeps.count_failures(conn, step_ids, error=error)
        _record(
            conn, rows, expiry.reason, actor=actor, report=report, namespace=namespace, hooks=hooks
        )
    else:
        rows = sweeps.return_waited(conn, step_ids, error=error)
        _record_waited(conn, rows, actor=actor, report=report, namespace=namespace, hooks=hooks)


def _record_waited(
    conn: Connection,
    rows: Sequence[Any],
    *,
    actor: str,
    report: SweepReport,
    namespace: str,
    hooks: Hooks,
) -> None:
    """Record wait-clock expiries: one event each (the count in a row in its detail)."""
    if not rows:
        return
    hooks.wait_expired(conn, rows)
    report.waited += len(rows)
    events.record(
        conn,
        [
            events.step_event(
                r,
                StepState.PROCESSING,
                StepState.PENDING,
                attempt=r.attempt,
                actor=actor,
                reason=clocks.WAIT_REASON,
                detail={"wait_expiries": r.wait_expiries, "agent": r.agent},
            )
            for r in rows
        ],
    )
    notify_ready(conn, namespace)  # ready now: a scheduler claims them again


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
    """Requests that were dead-lettered provably did not produce a reply for their attempt.
    Rejected by an agent (a malformed request, say): count the failure now, fenced by the
    attempt. Dropped by the broker before any agent took it (expired: the wait clock): the
    step is pending again, no failure counted, unless an agent said it started the attempt
    (a request redelivered after its agent died, then expired): the execution clock judges
    that one."""
    dead: list[DeadRequest] = []
    for delivery in deliveries:
        found = _dead_request(delivery)
        if found is not None:
            dead.append(found)
    if not dead:
        return

    def count(conn: Connection) -> None:
        lease.check(conn)
        run_ids = sweeps.runs_of(conn, [d.step_id for d in dead])
        sweeps.lock_runs(conn, run_ids, skip_locked=False)
        charged, waited = [], []
        for request in dead:
            fence = {"step_id": request.step_id, "attempt": request.attempt}
            error = request.expiry.error.to_json()
            if request.expiry.charged:
                row = sweeps.count_failure(conn, **fence, error=error)
                if row is not None:
                    charged.append(row)
            else:
                row = sweeps.return_not_taken(conn, **fence, error=error)
                if row is not None:
                    waited.append(row)
        report.dead_requests += len(charged)
        _record(
            conn,
            charged,
            "request dead-lettered",
            actor=actor,
            report=report,
            namespace=namespace,
            hooks=hooks,
        )
        _record_waited(conn, waited, actor=actor, report=report, namespace=namespace, hooks=hooks)

    run_transaction(engine, count)


@dataclass(frozen=True)
class DeadRequest:
    """The attempt a dead-lettered request names, and what its dead letter means."""

    step_id: int
    attempt: int
    expiry: clocks.Expiry


def _dead_request(delivery: Delivery) -> DeadRequest | None:
    """What a dead-lettered request names, or None (`Fence`: not a whole `Request`, since an
    agent dead-letters precisely the requests that fail to parse as one, and those too never
    reply). A sasflow copy (its reason header) was rejected by an agent: charged; the
    broker's own dead letter says why in `x-death`: expired or dropped for length before any
    agent took it (uncharged), else rejected (charged)."""
    try:
        fence = parse(Fence, delivery.body)
    except InvalidMessageError:
        return None  # not provably a request of ours: the operator's copy stays in <ns>.dead
    reason = delivery.headers.get(REASON_HEADER)
    if reason is None:
        deaths = delivery.headers.get("x-death") or [{}]
        death = deaths[0] if isinstance(deaths, list | tuple) and deaths else {}
        how = str(death.get("reason", "unknown")) if isinstance(death, dict) else "unknown"
        if how in NOT_TAKEN:
            expiry = clocks.not_taken(_milliseconds(death.get("original-expiration")), how)
            return DeadRequest(fence.step_id, fence.attempt, expiry)
        reason = f"broker dead-lettered the request ({how})"
    error = StoredError("RequestDeadLettered", str(reason))
    return DeadRequest(fence.step_id, fence.attempt, clocks.Expiry(charged=True, error=error))


def _milliseconds(value: Any) -> int | None:
    """An AMQP `expiration` (milliseconds as a decimal string), or None."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


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
    parked = {r.id for r in rows if r.state == StepState.PARKED}
    report.parked += len(parked)
    report.alerts.extend(raise_parked_alerts(conn, parked, actor=actor))
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
