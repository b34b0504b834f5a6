"""The long steps' check: it passes long runs that completed with each attempt executed once
(a new attempt is recovery, not a violation) and flags an attempt executed twice, a run left
unfinished and a submitted run never found."""

from __future__ import annotations

from tests.chaos.checks import Report
from tests.chaos.long_steps import Batch, LongRow, judge
from tests.chaos.remote import RemoteCall

BATCH = Batch(started=1000.0, keys=("long-0", "long-1"))


def _row(key: str, step_id: int, *, attempt: int = 1, state: str = "completed") -> LongRow:
    finished = 1015.5 if state == "completed" else None
    return LongRow(key=key, state=state, finished=finished, step_id=step_id, attempt=attempt)


def _call(step_id: int, attempt: int, *, deduplicated: bool = False) -> RemoteCall:
    return RemoteCall(
        key=f"key-{step_id}",
        step_id=step_id,
        run_id=step_id,
        step="long",
        attempt=attempt,
        pid=1,
        at=1015.0,
        deduplicated=deduplicated,
    )


def _judge(rows: list[LongRow], calls: list[RemoteCall]) -> Report:
    report = Report()
    judge(report, rows, calls, [BATCH], timeouts=2, told=10.0)
    return report


def test_long_steps_done_once_per_attempt_pass_and_are_described() -> None:
    rows = [_row("long-0", 1), _row("long-1", 2, attempt=2)]
    calls = [_call(1, 1), _call(2, 1), _call(2, 2, deduplicated=True)]
    report = _judge(rows, calls)
    assert report.violations == []
    assert report.figures["long_steps"] == {
        "runs": 2,
        "executed_twice": 0,
        "executions": {1: 1, 2: 1},
        "consumer_timeouts": 2,
    }
    text = report.text()
    assert "executions per step {1: 1, 2: 1}, attempts per step {1: 1, 2: 1}" in text
    assert "completed 15.5/15.5s" in text
    assert "channels the broker closed for it: 2" in text


def test_an_attempt_executed_twice_is_a_violation() -> None:
    rows = [_row("long-0", 1), _row("long-1", 2)]
    report = _judge(rows, [_call(1, 1), _call(2, 1), _call(2, 1, deduplicated=True)])
    assert len(report.violations) == 1
    assert "1 attempts executed more than once (step, attempt) [(2, 1)]" in report.violations[0]


def test_a_long_run_not_completed_or_not_found_is_a_violation() -> None:
    report = _judge([_row("long-0", 1, state="running")], [_call(1, 1)])
    assert len(report.violations) == 1
    assert "1 not found ['long-1'], 1 not completed ['long-0']" in report.violations[0]
