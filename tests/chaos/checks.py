"""The invariants checked after healing, and the printed report.

Each check compares what was done to the system (submissions, calls the remote service saw,
poison injected, faults) with what the state store, the broker and the fleet show.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, select

from sasflow.store.schema import events, runs, steps
from sasflow.transport.topology import REASON_HEADER
from sasflow.waits import EVENT_AGENT
from sasflow.workflow import TIMER_AGENT
from tests.chaos.broker import DeadLetter
from tests.chaos.concurrency import explain, history_overlaps, judge, processing_intervals
from tests.chaos.faults import ALL_FAULTS, Injected
from tests.chaos.fleet import Slot
from tests.chaos.remote import RemoteCall
from tests.chaos.sessions import LIMITED_ACTION, Session
from tests.chaos.workload import POISON_HEADER, STALE_MARK, Poison, Submissions


@dataclass
class Observed:
    """Everything the run gathered, handed to the checker."""

    submissions: Submissions
    calls: list[RemoteCall]
    effects: dict[str, dict[str, Any]]
    slots: list[Slot]
    poison: list[Poison]
    dead: list[DeadLetter]
    stale_sent: int
    past_deadline_max: int
    past_deadline_final: int
    injected: list[Injected]
    healed: bool
    heal_seconds: float
    fault_errors: list[str]
    fault_types: tuple[str, ...] = ALL_FAULTS
    """The kinds the schedule had to inject, each at least once."""
    sessions: list[Session] = field(default_factory=list)
    """The limited action's sessions at the remote service (tests/chaos/sessions.py)."""
    late_effects: int = 0
    """Effect calls the service refused: their session's lease had ended."""
    account_limit: int | None = 1
    """The concurrency per account the run defined (None: no limit)."""


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.lines.append(f"  [{'ok' if ok else 'VIOLATION'}] {name}: {detail}")
        if not ok:
            self.violations.append(f"{name}: {detail}")

    def text(self) -> str:
        verdict = "PASSED" if not self.violations else f"FAILED ({len(self.violations)})"
        return "\n".join(["== sasflow chaos report", *self.lines, f"== {verdict}"])


def _runs_and_steps(engine: Engine) -> tuple[list[Any], list[Any], dict[int, list[Any]]]:
    with engine.connect() as conn:
        run_rows = conn.execute(select(runs.c.id, runs.c.business_key, runs.c.state)).all()
        step_rows = conn.execute(
            select(
                steps.c.id,
                steps.c.run_id,
                steps.c.name,
                steps.c.agent,
                steps.c.state,
                steps.c.attempt,
                steps.c.failure_count,
                steps.c.idempotency_key,
                steps.c.output,
            )
        ).all()
        processed: dict[int, list[Any]] = defaultdict(list)
        for row in conn.execute(
            select(events.c.step_id, events.c.attempt, events.c.created_at).where(
                events.c.entity == "step", events.c.to_state == "processed"
            )
        ):
            processed[row.step_id].append(row)
    return list(run_rows), list(step_rows), processed


NO_AGENT = frozenset({TIMER_AGENT, EVENT_AGENT})
"""Timer and event-wait steps: no agent runs them, no effect or attempt is theirs
(tests/chaos/waits.py checks them)."""


def _stats(values: Sequence[float | None]) -> str:
    if not values:
        return "-"
    known = [v for v in values if v is not None]
    never = len(values) - len(known)
    if not known:
        return "never"
    text = f"{statistics.median(known):.1f}/{max(known):.1f}"
    return text + (f" +{never} never" if never else "")


def _concurrency(report: Report, engine: Engine, seen: Observed, step_rows: list[Any]) -> None:
    """8. One limited step at a time per account, from the agent side (the sessions), and
    what the database's history shows."""
    verdict = judge(seen.sessions)
    in_session = {(s.step_id, s.attempt) for s in seen.sessions}
    unseen = [
        r.id
        for r in step_rows
        if r.name == LIMITED_ACTION
        and r.state == "processed"
        and (r.id, r.attempt) not in in_session
    ]
    limit = "none" if seen.account_limit is None else f"{seen.account_limit} at once"
    most = max(verdict.most_at_once.values(), default=0)
    report.check(
        "one charge at a time per account (agent side)",
        verdict.holds and not unseen and verdict.sessions > 0,
        f"limit {limit}; {verdict.sessions} sessions, {verdict.accounts} accounts, most at "
        f"once per account {verdict.most_at_once}; {len(verdict.between)} overlaps of two "
        f"steps or attempts {verdict.between[:3]}, {len(verdict.within)} of two executions of "
        f"one attempt {verdict.within[:3]}; {seen.late_effects} late effects refused; "
        f"{len(unseen)} processed charges with no session {unseen[:5]}",
    )
    if not verdict.holds:
        report.lines.extend(explain(engine, verdict.pairs))
    history = history_overlaps(processing_intervals(engine))
    report.lines.append(
        f"  database side (step events, transaction times): {len(history)} overlapping "
        f"processing intervals of one account"
        + (f", longest {max(history) * 1000:.0f} ms" if history else "")
    )
    report.figures["sessions"] = verdict.sessions
    report.figures["accounts"] = verdict.accounts
    report.figures["most_at_once"] = most
    report.figures["session_overlaps"] = len(verdict.between) + len(verdict.within)
    report.figures["late_effects"] = seen.late_effects
    report.figures["history_overlaps"] = len(history)


def check(engine: Engine, seen: Observed) -> Report:  # noqa: PLR0912 - one list of checks
    report = Report()
    run_rows, step_rows, processed = _runs_and_steps(engine)
    keys = set(seen.submissions.keys)
    by_key = {r.business_key: r for r in run_rows}
    states = Counter(r.state for r in run_rows)
    report.lines.append(
        f"runs: {len(keys)} submitted (+{seen.submissions.duplicates} duplicate submissions, "
        f"{len(seen.submissions.unconfirmed)} never confirmed), {len(run_rows)} found, "
        f"states {dict(states)}; healed in {seen.heal_seconds:.1f}s"
    )

    # 1. No submitted run lost (and none invented), every one completed.
    lost = sorted(keys - by_key.keys())
    extra = sorted(by_key.keys() - keys - set(seen.submissions.unconfirmed))
    report.check(
        "no submitted run lost",
        not lost and not extra,
        f"{len(lost)} lost {lost[:5]}, {len(extra)} unexpected {extra[:5]}",
    )
    unfinished = [r.business_key for r in run_rows if r.state != "completed"]
    report.check(
        "every run completed after healing",
        seen.healed and not unfinished,
        f"{len(unfinished)} not completed {unfinished[:5]}",
    )

    # 2. Effects at the remote service: once per step, whatever the re-executions.
    keys_per_step: dict[int, set[str]] = defaultdict(set)
    steps_per_key: dict[str, set[int]] = defaultdict(set)
    for call in seen.calls:
        keys_per_step[call.step_id].add(call.key)
        steps_per_key[call.key].add(call.step_id)
    raw = len(seen.calls) - len(seen.effects)
    deduplicated = sum(1 for c in seen.calls if c.deduplicated)
    report.lines.append(
        f"remote service: {len(seen.calls)} calls, {len(seen.effects)} effects applied, "
        f"{raw} raw re-executions (all {deduplicated} answered from the idempotency record)"
    )
    double = [s for s, k in keys_per_step.items() if len(k) > 1]
    shared = [k for k, s in steps_per_key.items() if len(s) > 1]
    report.check(
        "no effect applied twice for one step",
        not double and not shared,
        f"{len(double)} steps called with several keys {double[:5]}, "
        f"{len(shared)} keys shared by several steps",
    )
    mismatched = []
    for row in step_rows:
        if row.state != "processed" or row.agent in NO_AGENT:
            continue
        effect = seen.effects.get(row.idempotency_key)
        output = row.output or {}
        if (
            effect is None
            or output.get("effect") != effect["effect"]
            or output.get("key") != row.idempotency_key
        ):
            mismatched.append(row.id)
    report.check(
        "every processed step holds its key's one effect",
        not mismatched,
        f"{len(mismatched)} mismatched {mismatched[:5]}",
    )

    # 3. Nothing left processing past its deadline plus the sweep interval.
    report.check(
        "nothing left processing past deadline + sweep interval",
        seen.past_deadline_max == 0 and seen.past_deadline_final == 0,
        f"max {seen.past_deadline_max} while healing, {seen.past_deadline_final} at the end",
    )

    # 4. No completion accepted from a superseded attempt.
    attempts_called = {(c.step_id, c.attempt) for c in seen.calls}
    superseded, stale_accepted, twice, uncalled = [], [], [], []
    for row in step_rows:
        if row.state != "processed":
            continue
        output = row.output or {}
        if output.get("mark") == STALE_MARK:
            stale_accepted.append(row.id)
        accepted = processed.get(row.id, [])
        if len(accepted) != 1:
            twice.append(row.id)
        if row.agent in NO_AGENT:
            continue
        if output.get("attempt") != row.attempt or any(e.attempt != row.attempt for e in accepted):
            superseded.append(row.id)
        if (row.id, output.get("attempt")) not in attempts_called:
            uncalled.append(row.id)
    retried = sum(1 for r in step_rows if r.attempt > 1)
    report.check(
        "no completion accepted from a superseded attempt",
        not superseded and not stale_accepted and not twice and not uncalled,
        f"{retried} steps ran >1 attempt; {len(superseded)} completed by an older "
        f"attempt, {len(stale_accepted)} of {seen.stale_sent} injected stale replies "
        f"accepted, {len(twice)} completed twice, {len(uncalled)} completed by an "
        "attempt the service never saw",
    )

    # 5. No process crash-looping.
    loops = [s.name for s in seen.slots if s.crash_looping()]
    restarts = ", ".join(
        f"{s.name}={s.starts - 1}"
        + (
            f"({sum(1 for e in s.exits if not e.expected)} unexpected)"
            if any(not e.expected for e in s.exits)
            else ""
        )
        for s in seen.slots
    )
    report.check("no process crash-looping", not loops, f"restarts: {restarts}; looping: {loops}")

    # 6. Every poison message dead-lettered with a reason.
    reasons: dict[str, str] = {}
    for letter in seen.dead:
        marker = letter.headers.get(POISON_HEADER)
        reason = letter.headers.get(REASON_HEADER)
        if isinstance(marker, (str, bytes)):
            text = reason.decode() if isinstance(reason, bytes) else str(reason or "")
            reasons[marker.decode() if isinstance(marker, bytes) else marker] = text
    missing = [p for p in seen.poison if not reasons.get(p.id)]
    by_queue = Counter(p.queue.rsplit(".", 1)[-1] for p in seen.poison)
    report.check(
        "every poison message dead-lettered with a reason",
        not missing,
        f"{len(seen.poison)} injected {dict(by_queue)}, "
        f"{len(seen.poison) - len(missing)} dead-lettered with a reason; missing: "
        f"{[(p.queue, p.kind) for p in missing[:5]]}",
    )

    # 7. The fault schedule ran.
    kinds = Counter(i.fault.kind for i in seen.injected if i.done)
    report.check(
        "faults carried out",
        not seen.fault_errors,
        f"{sum(kinds.values())} faults {dict(sorted(kinds.items()))}; "
        f"errors: {seen.fault_errors[:3]}",
    )
    report.figures["faults"] = dict(kinds)
    report.figures["missing_fault_types"] = sorted(set(seen.fault_types) - kinds.keys())

    _concurrency(report, engine, seen, step_rows)

    # Recovery per fault type: fault start -> the probe run's first step; -> in-flight settled.
    recovery: dict[str, list[float | None]] = defaultdict(list)
    settled: dict[str, list[float | None]] = defaultdict(list)
    lasted: dict[str, list[float | None]] = defaultdict(list)
    for record in seen.injected:
        if record.done:
            recovery[record.fault.kind].append(record.recovery)
            if record.in_flight:
                settled[record.fault.kind].append(record.settled)
            lasted[record.fault.kind].append(record.ended - record.started)
    report.lines.append(
        "recovery per fault type, seconds from the fault's start (median/max; "
        "'never' = not within the probe timeout; settled: faults that found "
        "steps in flight):"
    )
    report.lines.append(
        f"    {'fault':<16} {'n':>3} {'lasted':>13} {'next step done':>17} "
        f"  {'in-flight settled (faults with some)'}"
    )
    for kind in sorted(recovery):
        report.lines.append(
            f"    {kind:<16} {len(recovery[kind]):>3} {_stats(lasted[kind]):>13} "
            f"{_stats(recovery[kind]):>17} {len(settled[kind]):>3}: {_stats(settled[kind]):<14}"
        )
    report.figures["recovery_max"] = {
        k: max((v for v in values if v is not None), default=None) for k, values in recovery.items()
    }
    report.figures["never_recovered"] = sorted(
        k for k, values in recovery.items() if None in values
    )
    report.figures["runs"] = len(keys)
    report.figures["calls"] = len(seen.calls)
    return report
