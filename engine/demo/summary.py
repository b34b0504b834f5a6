"""What the demo did, read back from the state store (never from the roles' own counters).

The demo's runs are those whose business key starts with the demo's prefix, so a demo run
against a shared database counts only its own orders.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sasflow.states import TERMINAL_RUN_STATES, RunState
from sasflow.store.db import Engine
from sasflow.store.operator import inspect, waiting


@dataclass(frozen=True)
class Summary(inspect.PrefixCounts):
    """Counts of the demo's runs, steps, events and alerts, as the store holds them."""

    timers_fired: int
    events_matched: int
    events_before_wait: int
    event_timeouts: int

    @property
    def orders(self) -> int:
        return sum(self.runs_by_state.values())

    def state(self, name: str) -> int:
        return self.runs_by_state.get(name, 0)

    @property
    def finished(self) -> int:
        return sum(n for s, n in self.runs_by_state.items() if s in TERMINAL_RUN_STATES)

    def as_dict(self) -> dict[str, Any]:
        return {"orders": self.orders, **asdict(self)}


def summarize(engine: Engine, prefix: str) -> Summary:
    """The summary of the runs whose business key starts with `prefix`, in one snapshot-free
    read (the demo calls it once every role has stopped)."""
    with engine.connect() as conn:
        counts = inspect.count_prefix(conn, prefix)
        waits = waiting.count_waits(conn, prefix)
    fields = {**asdict(counts), **asdict(waits)}
    fields["runs_by_state"] = dict(sorted(counts.runs_by_state.items()))
    return Summary(**fields)


def missing_phenomena(summary: Summary, expected_orders: int, *, timeouts: int = 0) -> list[str]:
    """What the demo is designed to show but did not happen (empty: it ran as designed);
    `timeouts`: the orders whose payment is never confirmed (their waits time out and they are
    compensated)."""
    problems = []
    if summary.orders != expected_orders:
        problems.append(f"{summary.orders} runs recorded, {expected_orders} orders placed")
    if summary.finished != summary.orders:
        problems.append(f"{summary.orders - summary.finished} runs did not finish")
    expected_states = {
        RunState.COMPLETED: expected_orders - 2 - timeouts,
        RunState.ERROR: 1,
        RunState.COMPENSATED: 1 + timeouts,
    }
    # Every order that got past its charge waited for its confirmation and cooled off; the
    # declined one never did. The provider confirms every charge but the withheld ones: only
    # their waits time out.
    if summary.events_matched != expected_orders - 1 - timeouts:
        problems.append(
            f"expected {expected_orders - 1 - timeouts} payment confirmations matched, "
            f"found {summary.events_matched}"
        )
    if summary.event_timeouts != timeouts:
        problems.append(
            f"expected {timeouts} payment waits timed out, found {summary.event_timeouts}"
        )
    for state, count in expected_states.items():
        if summary.state(state) != count:
            problems.append(f"expected {count} {state} runs, found {summary.state(state)}")
    for what, value in (
        ("a step retried", summary.steps_retried),
        ("a step deferred by an open circuit breaker", summary.deferred),
        ("an expired step recovered by the supervisor", summary.expired_recovered),
        ("a compensation", summary.compensations_processed),
        ("an alert", summary.alerts_raised),
        ("a timer fired", summary.timers_fired),
        ("a payment confirmation stored before its wait opened", summary.events_before_wait),
    ):
        if value < 1:
            problems.append(f"no {what}")
    return problems
