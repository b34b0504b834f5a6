"""History retention: delete finished runs past their retention, in small batches, optionally
archiving each one (with its steps, events, alerts and the inbound events its waits consumed,
which are deleted with it) as a JSON line first; and the audit
trail's retention (`prune_audit`). `GrowthRetention` says how long the other things that grow
are kept (audit records, away subscribers, dead letters): the supervisor's retention pass
enforces it all, docs/operations.md#retention.

Called by `sasflow db prune` and, with the configured policy, by the supervisor. Each batch is
one short transaction that locks its runs with SKIP LOCKED: a run an operator, a scheduler or
the sweep holds is left for the next batch, and nothing ever waits for the prune. A run with
an open (unacknowledged) alert is kept until the alert is acknowledged. The whole action is one
`audit` row (action `runs.prune`), brought up to date in the transaction of every batch.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import IO, Any

from sasflow.errors import InvalidActionError
from sasflow.settings import Settings
from sasflow.states import TERMINAL_RUN_STATES, RunState
from sasflow.store.db import Connection, Engine, run_transaction, transaction
from sasflow.store.operator import audit, retention
from sasflow.store.operator.retention import RetentionRule

log = logging.getLogger(__name__)

PRUNE_ACTION = "runs.prune"
AUDIT_PRUNE_ACTION = "audit.prune"
DAY = 86400.0

FAILED_RUN_STATES = TERMINAL_RUN_STATES - {RunState.COMPLETED}
"""Finished without completing: error, compensation_failed, cancelled, compensated."""


@dataclass(frozen=True)
class RetentionPolicy:
    """How long finished runs are kept, per state; states without a rule are kept forever."""

    rules: tuple[RetentionRule, ...]

    def __post_init__(self) -> None:
        seen: set[RunState] = set()
        for rule in self.rules:
            active = set(rule.states) - TERMINAL_RUN_STATES
            if active:
                raise InvalidActionError(
                    f"only finished runs can be pruned, not {', '.join(sorted(active))}"
                )
            if rule.keep_s < 0:
                raise InvalidActionError("a retention cannot be negative")
            if seen & set(rule.states):
                raise InvalidActionError("a state has two retention rules")
            seen |= set(rule.states)

    @classmethod
    def of(cls, *, completed_days: float, failed_days: float) -> RetentionPolicy:
        """Completed runs kept `completed_days`, the other finished ones `failed_days`; 0 keeps
        them forever."""
        rules = []
        if completed_days > 0:
            rules.append(RetentionRule((RunState.COMPLETED,), completed_days * DAY))
        if failed_days > 0:
            rules.append(RetentionRule(tuple(sorted(FAILED_RUN_STATES)), failed_days * DAY))
        return cls(tuple(rules))

    @classmethod
    def from_settings(cls, settings: Settings) -> RetentionPolicy:
        return cls.of(
            completed_days=settings.retain_completed_days,
            failed_days=settings.retain_failed_days,
        )

    @classmethod
    def older_than(cls, seconds: float, states: Collection[RunState] = ()) -> RetentionPolicy:
        """One rule: runs in `states` (default: every finished state) finished more than
        `seconds` ago."""
        chosen = tuple(sorted(states or TERMINAL_RUN_STATES))
        return cls((RetentionRule(chosen, seconds),))

    def describe(self) -> list[dict[str, Any]]:
        return [{"states": list(r.states), "keep_s": r.keep_s} for r in self.rules]


@dataclass(frozen=True)
class GrowthRetention:
    """How long what else grows is kept; None: forever (or, for dead letters, no bound)."""

    audit_keep_s: float | None = None
    """Seconds an audit record is kept after it was written."""
    subscriber_alert_s: float | None = None
    """Seconds a stream subscriber may have no open stream before a `subscriber_away` alert."""
    subscriber_expire_s: float | None = None
    """Seconds without an open stream after which a subscriber is expired (deleted with its
    updates), no sooner than `subscriber_expire_s - subscriber_alert_s` after its alert."""
    dead_letters_keep_s: float | None = None
    """Seconds a dead letter stays in `<ns>.dead`."""
    dead_letters_max: int | None = None
    """Dead letters `<ns>.dead` holds at most (the oldest beyond it are removed)."""

    def __post_init__(self) -> None:
        if self.subscriber_expire_s is not None and not (
            self.subscriber_alert_s is not None
            and 0 < self.subscriber_alert_s < self.subscriber_expire_s
        ):
            raise InvalidActionError("a subscriber is alerted before it expires: alert < expiry")
        for name in ("audit_keep_s", "subscriber_alert_s", "dead_letters_keep_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise InvalidActionError(f"{name} must be above 0 (None: forever)")
        if self.dead_letters_max is not None and self.dead_letters_max < 1:
            raise InvalidActionError("dead_letters_max must be at least 1 (None: no bound)")

    @classmethod
    def from_settings(cls, settings: Settings) -> GrowthRetention:
        """The settings' retention (a 0 in them: forever, or no bound)."""
        return cls(
            audit_keep_s=settings.retain_audit_days * DAY or None,
            subscriber_alert_s=settings.api_stream_away_alert_s or None,
            subscriber_expire_s=settings.api_stream_expire_s or None,
            dead_letters_keep_s=settings.retain_dead_letters_days * DAY or None,
            dead_letters_max=settings.retain_dead_letters_max or None,
        )


@dataclass(frozen=True)
class PruneOptions:
    batch: int = 500
    """Runs deleted per transaction (their steps, events, alerts and consumed inbound events go
    with them)."""
    budget: float | None = None
    """Seconds the prune may take; what is left is pruned next time (None: until done)."""


@dataclass
class PruneReport:
    pruned: int = 0
    inbound_pruned: int = 0
    """Inbound events the pruned runs' waits had consumed, deleted with them."""
    batches: int = 0
    run_ids: list[int] = field(default_factory=list)
    """The runs deleted (or, with dry_run, that would be)."""
    complete: bool = True
    """False when the budget ran out with runs left to prune."""
    audit_id: int | None = None


def prune(
    engine: Engine,
    policy: RetentionPolicy,
    *,
    actor: str,
    reason: str,
    options: PruneOptions | None = None,
    dry_run: bool = False,
    export: IO[str] | None = None,
    check: Callable[[Connection], None] | None = None,
    collect_ids: bool = True,
) -> PruneReport:
    """Delete every run past `policy` (see the module docstring); with `export`, each run is
    written to it as one JSON line and fsynced before its batch's delete commits. `check` runs
    first in every transaction (the supervisor checks its lease there). Without `collect_ids`
    the report counts the runs but does not list them."""
    options = options or PruneOptions()
    if options.batch < 1:
        raise InvalidActionError("the batch size must be at least 1")
    report = PruneReport()
    if dry_run:
        with transaction(engine) as conn:
            seen: set[int] = set()
            for rule in policy.rules:
                for run_id in retention.prunable_ids(conn, rule):
                    if run_id not in seen:
                        seen.add(run_id)
                        report.run_ids.append(run_id)
        report.pruned = len(report.run_ids)
        return report

    deadline = None if options.budget is None else time.monotonic() + options.budget
    exported: set[int] = set()

    def one_batch(conn: Connection, rule: RetentionRule) -> tuple[list[int], int, int | None]:
        if check is not None:
            check(conn)
        ids = retention.lock_prunable(conn, rule, batch=options.batch)
        if not ids:
            return ids, 0, report.audit_id
        if export is not None:
            _write(export, [r for r in retention.archive(conn, ids) if r["id"] not in exported])
        consumed = retention.delete_consumed_events(conn, ids)
        retention.delete_runs(conn, ids)
        detail = {
            "pruned": report.pruned + len(ids),
            "inbound_events": report.inbound_pruned + consumed,
            "batches": report.batches + 1,
            "policy": policy.describe(),
            "export": getattr(export, "name", None) if export is not None else None,
        }
        audit_id = report.audit_id
        if audit_id is None:
            audit_id = audit.record(
                conn, audit.AuditRecord(actor, PRUNE_ACTION, reason, detail=detail)
            )
        else:
            audit.update_detail(conn, audit_id, detail)
        return ids, consumed, audit_id

    for rule in policy.rules:
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                report.complete = False
                return report
            ids, consumed, report.audit_id = run_transaction(
                engine, functools.partial(one_batch, rule=rule)
            )
            if export is not None:
                exported.update(ids)
            report.pruned += len(ids)
            report.inbound_pruned += consumed
            report.batches += 1 if ids else 0
            if collect_ids:
                report.run_ids.extend(ids)
            if len(ids) < options.batch:
                break  # a short batch: this rule has nothing more (or only locked runs)
    if report.pruned:
        log.info(
            "%s pruned %d finished run(s) (and %d consumed inbound event(s)) in %d batch(es)",
            actor,
            report.pruned,
            report.inbound_pruned,
            report.batches,
        )
    return report


def _write(export: IO[str], archived: list[dict[str, Any]]) -> None:
    """Append the runs and make them durable before the delete that follows commits."""
    for run in archived:
        export.write(json.dumps(run, default=_json_default, ensure_ascii=False) + "\n")
    export.flush()
    os.fsync(export.fileno())


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def prune_audit(
    engine: Engine,
    keep_s: float,
    *,
    actor: str,
    batch: int = 1000,
    budget: float | None = None,
    check: Callable[[Connection], None] | None = None,
) -> PruneReport:
    """Delete the audit records written more than `keep_s` seconds ago, `batch` per
    transaction, the oldest first, within `budget` seconds. What it deleted is itself one
    record (action `audit.prune`), written with the first batch and brought up to date by
    each, so the trail says when and how much of it retention removed. `check` runs first
    in every transaction (the supervisor checks its lease there)."""
    report = PruneReport()
    deadline = None if budget is None else time.monotonic() + budget

    def one_batch(conn: Connection) -> tuple[int, int | None]:
        if check is not None:
            check(conn)
        deleted = audit.prune(conn, keep_s=keep_s, batch=batch)
        if not deleted:
            return 0, report.audit_id
        detail = {
            "pruned": report.pruned + deleted,
            "batches": report.batches + 1,
            "keep_days": keep_s / DAY,
        }
        if report.audit_id is None:
            record = audit.AuditRecord(actor, AUDIT_PRUNE_ACTION, "retention", detail=detail)
            return deleted, audit.record(conn, record)
        audit.update_detail(conn, report.audit_id, detail)
        return deleted, report.audit_id

    while True:
        if deadline is not None and time.monotonic() >= deadline:
            report.complete = False
            break
        deleted, report.audit_id = run_transaction(engine, one_batch)
        report.pruned += deleted
        report.batches += 1 if deleted else 0
        if deleted < batch:
            break
    if report.pruned:
        log.info("%s pruned %d audit record(s)", actor, report.pruned)
    return report
