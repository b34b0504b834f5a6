"""Timers and event waits under the faults: the `chaos_wait` runs (tests/chaos/app.py: an agent
step, a 1 s timer, a wait for `chaos_paid` matched on `input.order` with an 8 s timeout that
completes with `TIMED_OUT`), the events the driver sends them on `<ns>.events` over AMQP like
an outside producer, and what is checked about them after healing.

Each run's event is planned from the seed: sent before the run is submitted (stored first),
after its wait opened, sent twice under one id (before and after the opening, or twice after
it), or never sent (the wait must time out with its default). Stray events match no run (a
correlation no run has) and must stay unmatched.

Checked, all on the database clock (the events' and inbound events' times):
- every timer fired once (one `processed` event, no attempt) and never early: fired at or after
  the time it became ready (its `waiting -> pending` event) plus its seconds;
- every event stored once per id and consumed at most once: one row per (name, id), one event
  per wait in the history, no event id completing two waits, a consumed event's payload is
  its wait's output;
- every wait ended by its event or by its on_timeout: an event received more than MARGIN
  before the wait's deadline (opened + timeout) completed it with its payload; a wait without
  its event completed with `TIMED_OUT`, not before its deadline; an event confirmed by the
  broker was stored;
- unmatched events never consumed: the strays, and events that came after their wait's end.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from sasflow.store.schema import events, inbound_events, runs, steps
from sasflow.transport.topology import Names
from tests.chaos.app import TIMED_OUT, TIMER_S, WAIT_EVENT, WAIT_TIMEOUT_S, wait_run
from tests.chaos.broker import Publisher
from tests.chaos.checks import Report
from tests.chaos.workload import Driver

KINDS = {"before": 2, "after": 3, "dup_before": 1.5, "dup_after": 1.5, "never": 2}
"""How each run's event is sent (weights): before the run is submitted, after its wait opened,
twice under one id (before and after the opening; twice after it), or never."""
SENT_FIRST = ("before", "dup_before")
SENT_AFTER = ("after", "dup_before", "dup_after")
STRAY_EVERY = 5
"""One event matching no run after every this many runs."""
MARGIN = 2.0
"""Seconds either side of a wait's deadline where an event may lose to the timeout (the event's
transaction started before the deadline, the timeout's committed first): either end is right
there, as long as the wait and the event agree."""
TAIL_S = 90.0
"""Seconds the driver keeps sending the events of waits opened after its last submission."""
TIMER_STEP, WAIT_STEP = "cool", "paid"


def plan(seed: int, count: int) -> list[str]:
    """How each of `count` runs gets its event: a pure function of the seed, every kind at
    least once when `count` allows."""
    rng = random.Random(f"{seed}:waits")  # noqa: S311 - reproducible
    kinds = list(KINDS)[:count]
    kinds += rng.choices(list(KINDS), weights=list(KINDS.values()), k=count - len(kinds))
    rng.shuffle(kinds)
    return kinds


def payload(key: str, event_id: str) -> dict[str, Any]:
    return {"order": key, "event_id": event_id, "paid": True}


def document(correlation: str, event_id: str) -> bytes:
    """The event as an outside producer sends it on `<ns>.events` (docs/protocol.md)."""
    return json.dumps(
        {
            "name": WAIT_EVENT,
            "correlation": correlation,
            "id": event_id,
            "payload": payload(correlation, event_id),
        }
    ).encode()


@dataclass(frozen=True)
class Sent:
    """One event the driver published (a duplicate is another `Sent` with the same id)."""

    correlation: str
    event_id: str
    kind: str
    confirmed: bool


@dataclass(eq=False)
class WaitDriver(threading.Thread):
    """Submits the `chaos_wait` runs over the window (in step with the fault schedule, like the
    main driver) and sends their events and the strays."""

    url: str
    names: Names
    engine: Engine
    driver: Driver
    seed: int
    count: int
    window: float
    progress: Callable[[], float] = lambda: 1.0
    kinds: dict[str, str] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(name="chaos-waits", daemon=True)
        self.publisher = Publisher(self.url)
        self.pending: list[tuple[str, str]] = []
        """(key, kind) of runs whose event goes once their wait opened."""

    def run(self) -> None:
        started = time.monotonic()
        try:
            for i, kind in enumerate(plan(self.seed, self.count)):
                key = f"w{self.seed}-{i}"
                self.kinds[key] = kind
                if kind in SENT_FIRST:
                    self._send(key, kind)
                self.driver.submit_once(self.publisher, key, submission(key))
                if kind in SENT_AFTER:
                    self.pending.append((key, kind))
                if i % STRAY_EVERY == STRAY_EVERY - 1:
                    self._send(f"stray-{self.seed}-{i}", "stray")
                due = started + (i + 1) * self.window / self.count
                while not self.stop.is_set() and (
                    time.monotonic() < due or self.progress() < (i + 1) / self.count
                ):
                    self._send_opened()
                    self.stop.wait(0.25)
            tail = time.monotonic() + TAIL_S
            while self.pending and not self.stop.is_set() and time.monotonic() < tail:
                self._send_opened()
                self.stop.wait(0.25)
        finally:
            self.publisher.close()

    def _send(self, correlation: str, kind: str, copies: int = 1) -> None:
        for _ in range(copies):
            ok = self.publisher.publish(
                self.names.events,
                document(correlation, f"paid-{correlation}"),
                deadline=time.monotonic() + 120,
            )
            self.sent.append(Sent(correlation, f"paid-{correlation}", kind, ok))

    def _send_opened(self) -> None:
        """Send the events of the pending runs whose wait opened (or already ended)."""
        if not self.pending:
            return
        try:
            with self.engine.connect() as conn:
                opened = set(
                    conn.execute(
                        select(runs.c.business_key)
                        .join(steps, steps.c.run_id == runs.c.id)
                        .where(
                            runs.c.workflow == wait_run.name,
                            runs.c.business_key.in_([key for key, _ in self.pending]),
                            steps.c.name == WAIT_STEP,
                            steps.c.state != "waiting",
                        )
                    ).scalars()
                )
        except SQLAlchemyError:
            return
        for key, kind in [p for p in self.pending if p[0] in opened]:
            self._send(key, kind, copies=2 if kind == "dup_after" else 1)
            self.pending.remove((key, kind))

    def check(self, report: Report) -> None:
        judge(report, read_rows(self.engine, list(self.kinds)), self.kinds, self.sent)


def submission(key: str) -> bytes:
    return json.dumps(
        {"workflow": wait_run.name, "key": key, "input": {"order": key, "work": 0.2}}
    ).encode()


@dataclass(frozen=True)
class StepRow:
    """A `chaos_wait` run's timer or wait step and its history after healing."""

    key: str
    run_state: str
    step_id: int
    name: str
    state: str
    attempt: int
    output: Any
    opened: tuple[datetime, ...]
    """Times of its `waiting -> pending` events (it became ready: the timer started, the wait
    opened)."""
    ended: tuple[tuple[datetime, str, str | None], ...]
    """Its `-> processed` events: (time, reason, the event id that completed it)."""


@dataclass(frozen=True)
class Inbound:
    """A stored event."""

    event_id: str
    correlation: str
    payload: Any
    received: datetime
    consumed_by: int | None


@dataclass(frozen=True)
class Rows:
    steps: list[StepRow]
    inbound: list[Inbound]


def read_rows(engine: Engine, keys: Sequence[str]) -> Rows:
    history: dict[int, list[Any]] = defaultdict(list)
    with engine.connect() as conn:
        step_rows = conn.execute(
            select(
                runs.c.business_key,
                runs.c.state.label("run_state"),
                steps.c.id,
                steps.c.name,
                steps.c.state,
                steps.c.attempt,
                steps.c.output,
            )
            .join(steps, steps.c.run_id == runs.c.id)
            .where(
                runs.c.workflow == wait_run.name,
                runs.c.business_key.in_(keys),
                steps.c.name.in_((TIMER_STEP, WAIT_STEP)),
            )
        ).all()
        for row in conn.execute(
            select(events.c.step_id, events.c.to_state, events.c.reason, events.c.detail)
            .add_columns(events.c.from_state, events.c.created_at)
            .where(events.c.entity == "step", events.c.step_id.in_([r.id for r in step_rows]))
            .order_by(events.c.id)
        ):
            history[row.step_id].append(row)
        stored = conn.execute(
            select(inbound_events).where(inbound_events.c.name == WAIT_EVENT)
        ).all()
    rows = []
    for r in step_rows:
        done = history[r.id]
        rows.append(
            StepRow(
                key=r.business_key,
                run_state=r.run_state,
                step_id=r.id,
                name=r.name,
                state=r.state,
                attempt=r.attempt,
                output=r.output,
                opened=tuple(
                    e.created_at
                    for e in done
                    if e.from_state == "waiting" and e.to_state == "pending"
                ),
                ended=tuple(
                    (e.created_at, e.reason or "", (e.detail or {}).get("event_id"))
                    for e in done
                    if e.to_state == "processed"
                ),
            )
        )
    return Rows(
        rows,
        [
            Inbound(s.event_id, s.correlation, s.payload, s.received_at, s.consumed_step_id)
            for s in stored
        ],
    )


def _seconds(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f}/{max(values):.2f}s" if values else "-"


def _timers(report: Report, timers: Sequence[StepRow], keys: Sequence[str]) -> None:
    by_key = {t.key: t for t in timers}
    missing = sorted(set(keys) - by_key.keys())
    twice, early, unfired, lateness = [], [], [], []
    for t in timers:
        if t.state != "processed" or not t.ended:
            unfired.append(t.key)
            continue
        if len(t.ended) != 1 or len(t.opened) != 1 or t.attempt != 0:
            twice.append(t.key)
        if t.opened:
            due = t.opened[0] + timedelta(seconds=TIMER_S)
            fired = min(moment for moment, _, _ in t.ended)
            if fired < due:
                early.append((t.key, round((due - fired).total_seconds(), 6)))
            lateness.append((fired - due).total_seconds())
    fired_count = sum(1 for t in timers if t.ended)
    report.check(
        "every timer fired once, never early",
        not (missing or twice or early or unfired),
        f"{fired_count} timers of {TIMER_S:g}s fired, late by {_seconds(lateness)} "
        f"(median/max, database clock); {len(missing)} runs without a timer {missing[:3]}, "
        f"{len(unfired)} never fired {unfired[:3]}, {len(twice)} fired or started more than "
        f"once or ran an attempt {twice[:3]}, {len(early)} fired early {early[:3]}",
    )
    report.figures["timers"] = {
        "fired": fired_count,
        "max_late_s": max(lateness, default=None),
        "early": len(early),
        "twice": len(twice),
    }


def _consumed_once(
    report: Report, waits: Sequence[StepRow], rows: Rows, sent: Sequence[Sent]
) -> None:
    stored = Counter(s.event_id for s in rows.inbound)
    stored_twice = sorted(i for i, n in stored.items() if n > 1)
    by_step = {w.step_id: w for w in waits}
    two_events = sorted(w.key for w in waits if sum(r == "event" for _, r, _ in w.ended) > 1)
    completing: dict[str, set[int]] = defaultdict(set)
    for w in waits:
        for _, reason, event_id in w.ended:
            if reason == "event" and event_id is not None:
                completing[event_id].add(w.step_id)
    two_waits = sorted(i for i, ids in completing.items() if len(ids) > 1)
    wrong = []
    for s in rows.inbound:
        if s.consumed_by is None:
            continue
        wait = by_step.get(s.consumed_by)
        if wait is None or wait.output != s.payload or completing.get(s.event_id) != {wait.step_id}:
            wrong.append(s.event_id)
    ids = Counter(s.event_id for s in sent)
    consumed = sum(1 for s in rows.inbound if s.consumed_by is not None)
    report.check(
        "every event stored once and consumed at most once",
        not (stored_twice or two_events or two_waits or wrong),
        f"{len(ids)} events sent ({sum(ids.values()) - len(ids)} duplicate copies of "
        f"{sum(1 for n in ids.values() if n > 1)} ids), {len(rows.inbound)} stored, "
        f"{consumed} consumed; {len(stored_twice)} ids stored twice {stored_twice[:3]}, "
        f"{len(two_events)} waits completed by two events {two_events[:3]}, {len(two_waits)} "
        f"events completing two waits {two_waits[:3]}, {len(wrong)} consumed events not their "
        f"wait's output {wrong[:3]}",
    )
    report.figures["events"] = {
        "sent": len(ids),
        "duplicate_copies": sum(ids.values()) - len(ids),
        "stored": len(rows.inbound),
        "consumed": consumed,
    }


def _ended(
    report: Report,
    waits: Sequence[StepRow],
    rows: Rows,
    kinds: dict[str, str],
    sent: Sequence[Sent],
) -> None:
    by_correlation: dict[str, list[Inbound]] = defaultdict(list)
    for stored in sorted(rows.inbound, key=lambda s: s.received):
        by_correlation[stored.correlation].append(stored)
    confirmed = {s.correlation for s in sent if s.confirmed}
    lost = sorted(c for c in confirmed if c not in by_correlation)
    missing = sorted(set(kinds) - {w.key for w in waits})
    unended, not_theirs, ignored, early, first = [], [], [], [], 0
    outcomes: Counter[str] = Counter()
    for w in waits:
        if (
            w.state != "processed"
            or w.run_state != "completed"
            or len(w.ended) != 1
            or not w.opened
        ):
            unended.append(w.key)
            continue
        deadline = w.opened[0] + timedelta(seconds=WAIT_TIMEOUT_S)
        mine = by_correlation.get(w.key, [])
        event = next((s for s in mine if s.consumed_by == w.step_id), mine[0] if mine else None)
        moment, reason, _ = w.ended[0]
        if event is not None and event.received < w.opened[0]:
            first += 1
        if event is not None and w.output == event.payload and event.consumed_by == w.step_id:
            outcomes["event"] += 1
        elif w.output == TIMED_OUT and reason == "event timeout":
            outcomes["timed out" if kinds.get(w.key) == "never" else "event late"] += 1
            if moment < deadline:
                early.append(w.key)
            if event is not None and event.received <= deadline - timedelta(seconds=MARGIN):
                ignored.append(w.key)
            if event is not None and event.consumed_by == w.step_id:
                not_theirs.append(w.key)
        else:
            not_theirs.append(w.key)
    report.check(
        "every wait ended by its event or by its on_timeout",
        not (lost or missing or unended or not_theirs or ignored or early),
        f"{dict(outcomes)} ({first} events stored before their wait opened); {len(lost)} "
        f"confirmed events never stored {lost[:3]}, {len(missing)} runs without a wait "
        f"{missing[:3]}, {len(unended)} not ended once in a completed run {unended[:3]}, "
        f"{len(not_theirs)} ended with another output {not_theirs[:3]}, {len(ignored)} timed "
        f"out with their event stored in time {ignored[:3]}, {len(early)} timed out early "
        f"{early[:3]}",
    )
    report.figures["waits"] = {**outcomes, "stored_first": first}


def judge(report: Report, rows: Rows, kinds: dict[str, str], sent: Sequence[Sent]) -> None:
    """The timers' and event waits' checks (see the module docstring); `kinds`: each run's
    key and how its event was sent; `sent`: every event published."""
    timers = [r for r in rows.steps if r.name == TIMER_STEP]
    waits = [r for r in rows.steps if r.name == WAIT_STEP]
    _timers(report, timers, list(kinds))
    _consumed_once(report, waits, rows, sent)
    _ended(report, waits, rows, kinds, sent)
    strays = {s.correlation for s in sent if s.kind == "stray"}
    consumed = sorted(
        s.correlation for s in rows.inbound if s.correlation in strays and s.consumed_by
    )
    stored = sum(1 for s in rows.inbound if s.correlation in strays)
    late = sum(1 for s in rows.inbound if s.correlation not in strays and s.consumed_by is None)
    report.check(
        "unmatched events never consumed",
        not consumed,
        f"{len(strays)} events matching no run sent, {stored} stored, {len(consumed)} consumed "
        f"{consumed[:3]}; {late} events that came after their wait ended left unmatched",
    )
