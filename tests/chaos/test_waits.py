"""The timers' and event waits' checks (tests/chaos/waits.py): a consistent history passes
with its figures, and each corrupted row (a timer fired twice or early, an event consumed by
two waits or stored twice, a wait timed out beside its event, a stray consumed) is reported
under exactly the invariant it breaks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tests.chaos.app import TIMED_OUT, TIMER_S, WAIT_TIMEOUT_S
from tests.chaos.checks import Report
from tests.chaos.waits import (
    TIMER_STEP,
    WAIT_STEP,
    Inbound,
    Rows,
    Sent,
    StepRow,
    judge,
    payload,
)

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
KINDS = {"w-0": "before", "w-1": "after", "w-2": "dup_after", "w-3": "never"}


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _history() -> tuple[Rows, list[Sent]]:
    """Each run: timer ready at n*10 s, fired 0.1 s after due; its wait opened when the timer
    fired; its event received at the offset its kind gives (w-0 before the opening)."""
    step_rows, inbound, sent = [], [], []
    received = {"w-0": -5.0, "w-1": 0.5, "w-2": 0.4}
    for n, (key, kind) in enumerate(KINDS.items()):
        ready = n * 10.0
        fired = ready + TIMER_S + 0.1
        timer = StepRow(
            key, "completed", 100 + n, TIMER_STEP, "processed", 0, {"slept_until": "x"},
            opened=(_at(ready),), ended=((_at(fired), "timer", None),),
        )  # fmt: skip
        event_id = f"paid-{key}"
        ended: tuple[tuple[datetime, str, str | None], ...]
        output: object
        if key in received:
            body = payload(key, event_id)
            inbound.append(Inbound(event_id, key, body, _at(fired + received[key]), 200 + n))
            ended = ((_at(fired + max(0.0, received[key])), "event", event_id),)
            output = body
            copies = 2 if kind == "dup_after" else 1
            sent += [Sent(key, event_id, kind, True)] * copies
        else:
            ended = ((_at(fired + WAIT_TIMEOUT_S + 0.2), "event timeout", None),)
            output = TIMED_OUT
        wait = StepRow(
            key, "completed", 200 + n, WAIT_STEP, "processed", 0, output,
            opened=(_at(fired),), ended=ended,
        )  # fmt: skip
        step_rows += [timer, wait]
    stray = "stray-1-4"
    inbound.append(Inbound(f"paid-{stray}", stray, payload(stray, "x"), _at(1.0), None))
    sent.append(Sent(stray, f"paid-{stray}", "stray", True))
    return Rows(step_rows, inbound), sent


def _judge(rows: Rows, sent: list[Sent]) -> Report:
    report = Report()
    judge(report, rows, KINDS, sent)
    return report


def test_a_consistent_history_passes_with_its_figures() -> None:
    report = _judge(*_history())
    assert report.violations == [], report.text()
    assert report.figures["timers"] == {"fired": 4, "max_late_s": 0.1, "early": 0, "twice": 0}
    assert report.figures["events"] == {
        "sent": 4,
        "duplicate_copies": 1,
        "stored": 4,
        "consumed": 3,
    }
    assert report.figures["waits"] == {"event": 3, "timed out": 1, "stored_first": 1}
    assert "4 timers of 1s fired, late by 0.10/0.10s" in report.text()


def _step(rows: Rows, key: str, name: str) -> StepRow:
    return next(s for s in rows.steps if s.key == key and s.name == name)


def _swap(rows: Rows, old: StepRow, new: StepRow) -> Rows:
    return Rows([new if s is old else s for s in rows.steps], rows.inbound)


def _timer_fired_twice(rows: Rows) -> Rows:
    timer = _step(rows, "w-1", TIMER_STEP)
    again = (timer.ended[0][0] + timedelta(seconds=0.5), "timer", None)
    return _swap(rows, timer, replace(timer, ended=(*timer.ended, again)))


def _timer_fired_early(rows: Rows) -> Rows:
    timer = _step(rows, "w-2", TIMER_STEP)
    due = timer.opened[0] + timedelta(seconds=TIMER_S)
    return _swap(
        rows, timer, replace(timer, ended=((due - timedelta(microseconds=1), "timer", None),))
    )


def _timer_ran_an_attempt(rows: Rows) -> Rows:
    timer = _step(rows, "w-0", TIMER_STEP)
    return _swap(rows, timer, replace(timer, attempt=1))


def _event_consumed_twice(rows: Rows) -> Rows:
    """w-1's event also completed w-2's wait (w-2's own event left unconsumed)."""
    first, second = _step(rows, "w-1", WAIT_STEP), _step(rows, "w-2", WAIT_STEP)
    stolen = (second.ended[0][0], "event", first.ended[0][2])
    rows = _swap(rows, second, replace(second, output=first.output, ended=(stolen,)))
    inbound = [replace(s, consumed_by=None) if s.correlation == "w-2" else s for s in rows.inbound]
    return Rows(rows.steps, inbound)


def _event_stored_twice(rows: Rows) -> Rows:
    copy = replace(next(s for s in rows.inbound if s.correlation == "w-2"), consumed_by=None)
    return Rows(rows.steps, [*rows.inbound, copy])


def _timed_out_beside_its_event(rows: Rows) -> Rows:
    wait = _step(rows, "w-1", WAIT_STEP)
    moment = wait.opened[0] + timedelta(seconds=WAIT_TIMEOUT_S)
    timed_out = replace(wait, output=TIMED_OUT, ended=((moment, "event timeout", None),))
    inbound = [replace(s, consumed_by=None) if s.correlation == "w-1" else s for s in rows.inbound]
    return Rows(_swap(rows, wait, timed_out).steps, inbound)


def _timed_out_early(rows: Rows) -> Rows:
    wait = _step(rows, "w-3", WAIT_STEP)
    moment = wait.opened[0] + timedelta(seconds=WAIT_TIMEOUT_S - 0.001)
    return _swap(rows, wait, replace(wait, ended=((moment, "event timeout", None),)))


def _stray_consumed(rows: Rows) -> Rows:
    inbound = [
        replace(s, consumed_by=999) if s.correlation.startswith("stray") else s
        for s in rows.inbound
    ]
    return Rows(rows.steps, inbound)


TIMERS = "every timer fired once, never early"
ONCE = "every event stored once and consumed at most once"
ENDED = "every wait ended by its event or by its on_timeout"
STRAYS = "unmatched events never consumed"


@pytest.mark.parametrize(
    ("break_it", "invariants", "detail"),
    [
        (_timer_fired_twice, [TIMERS], "1 fired or started more than once"),
        (_timer_fired_early, [TIMERS], "1 fired early [('w-2', 1e-06)]"),
        (_timer_ran_an_attempt, [TIMERS], "or ran an attempt ['w-0']"),
        # The event that completed two waits is also not w-2's: its wait has another output.
        (_event_consumed_twice, [ONCE, ENDED], "1 events completing two waits ['paid-w-1']"),
        (_event_stored_twice, [ONCE], "1 ids stored twice ['paid-w-2']"),
        (_timed_out_beside_its_event, [ENDED], "1 timed out with their event stored in time"),
        (_timed_out_early, [ENDED], "1 timed out early ['w-3']"),
        (_stray_consumed, [ONCE, STRAYS], "1 consumed ['stray-1-4']"),
    ],
)
def test_each_corrupted_row_is_a_violation(
    break_it: Callable[[Rows], Rows], invariants: list[str], detail: str
) -> None:
    rows, sent = _history()
    report = _judge(break_it(rows), sent)
    assert [v.split(":")[0] for v in report.violations] == invariants, report.text()
    assert any(detail in v for v in report.violations), report.violations
