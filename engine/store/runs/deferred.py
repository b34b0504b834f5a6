"""Runs whose advance was left to the schedulers' advance duty (`runs.advance_due`): user code
to run off the loop (input builders, the run's output), or a workflow version the scheduler
that applied a reply had not loaded (docs/architecture.md, "Advancing off the loop").

`take` holds a batch of them for one scheduler (their `advance_due` pushed to the end of the
hold, so no other scheduler takes them meanwhile; a scheduler that dies lets its hold expire)
and reads them as snapshots; `advance` decides each again, in a short transaction of its own,
from its rows as they are then and what was built from the snapshot, and clears the mark
unless the decision marks it again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select, update

from sasflow.registry import Registry
from sasflow.states import ACTIVE_RUN_STATES
from sasflow.store.cluster.versions import VersionKey, matching
from sasflow.store.notify import notify_ready
from sasflow.store.outbox.alerts import Alert, AlertKind, open_alerts, raise_alert, resolve_open
from sasflow.store.runs import events, queries
from sasflow.store.runs.advance import advance_runs
from sasflow.store.runs.apply import ApplyReport
from sasflow.store.runs.decide import Built
from sasflow.store.runs.records import RunRecord, StepRecord
from sasflow.store.schema import runs
from sasflow.store.sqltime import now, plus_seconds


@dataclass(frozen=True)
class Snapshot:
    """A run held for advancing, and its steps, as read when it was taken."""

    run: RunRecord
    steps: tuple[StepRecord, ...]


def take(
    conn: Connection, loaded: tuple[VersionKey, ...], *, batch: int, hold_s: float
) -> list[Snapshot]:
    """Hold up to `batch` runs due for advancing whose version is `loaded` here, for
    `hold_s` seconds, and read them (ix_runs_advance_due)."""
    ids = list(
        conn.execute(
            select(runs.c.id)
            .where(runs.c.advance_due <= now(), matching(loaded))
            .order_by(runs.c.advance_due)
            .limit(batch)
            .with_for_update(skip_locked=True)
        ).scalars()
    )
    if not ids:
        return []
    conn.execute(
        update(runs).where(runs.c.id.in_(ids)).values(advance_due=plus_seconds(now(), hold_s))
    )
    by_run: dict[int, list[StepRecord]] = defaultdict(list)
    for row in conn.execute(queries.steps_of_runs(), {"b_run_ids": ids}):
        by_run[row.run_id].append(StepRecord.from_row(row._mapping))
    found = conn.execute(queries.runs_by_id(), {"b_run_ids": ids})
    return [
        Snapshot(run, tuple(by_run[run.id]))
        for run in (RunRecord.from_row(r._mapping) for r in found)
    ]


def advance(
    conn: Connection,
    registry: Registry,
    built: Mapping[int, Built],
    *,
    namespace: str,
    actor: str,
) -> ApplyReport:
    """Advance the runs of `built` (run id -> what was built for it) in the caller's
    transaction: the mark cleared, each decided again from its rows with what was built (a
    step made ready meanwhile keeps what it has; one newly ready marks the run again)."""
    report = ApplyReport()
    ids = sorted(built)
    if not ids:
        return report
    locked = conn.execute(queries.runs_by_id(), {"b_run_ids": ids}).all()
    conn.execute(update(runs).where(runs.c.id.in_(ids)).values(advance_due=None))
    active = [r.id for r in locked if r.state in ACTIVE_RUN_STATES]
    advanced = advance_runs(conn, registry, active, actor=actor, locked=locked, built=built)
    events.record(conn, advanced.events, with_callback={r.id for r in locked if r.callback_url})
    report.ready = advanced.ready
    report.deferred = advanced.deferred
    report.finished = events.finished_runs(advanced.events)
    if advanced.ready:
        notify_ready(conn, namespace)
    return report


def raise_missing(conn: Connection, missing: Mapping[VersionKey, Any], *, actor: str) -> list[int]:
    """One `version_missing` alert per workflow version in `missing` (its detail), unless one
    is open already; the ids of those raised."""
    raised = []
    for (workflow, version), detail in sorted(missing.items()):
        alert = Alert(
            AlertKind.VERSION_MISSING,
            f"{workflow}@{version}",
            f"runs of workflow {workflow!r} version {version} wait to advance and no live "
            f"scheduler has that version loaded; deploy it (docs/howto/upgrade.md)",
            detail={**detail, "reported_by": actor},
        )
        alert_id = raise_alert(conn, alert)
        if alert_id is not None:
            raised.append(alert_id)
    return raised


def resolve_missing(conn: Connection, loaded: set[VersionKey], *, actor: str) -> int:
    """Resolve the open `version_missing` alerts of versions in `loaded` (a live scheduler has
    them now); how many were resolved."""
    resolved = 0
    for row in open_alerts(conn, AlertKind.VERSION_MISSING):
        subject = row.dedup_key.removeprefix(f"{AlertKind.VERSION_MISSING}:")
        workflow, _, version = subject.rpartition("@")
        if version.isdigit() and (workflow, int(version)) in loaded:
            resolved += resolve_open(
                conn, row.dedup_key, actor=actor, reason="a live scheduler has the version"
            )
    return resolved
