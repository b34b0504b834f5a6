"""What the demo did, read back from the state store (never from the roles' own counters).

The demo's runs are those whose business key starts with the demo's prefix, so a demo run
against a shared database counts only its own orders.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sasflow.states import TERMINAL_RUN_STATES, RunState
from sasflow.store import inspect
from sasflow.store.db import Engine


@dataclass(frozen=True)
class Summary:
    """Counts of the demo's runs, steps, events and alerts, as the store holds them."""

    orders: int
    runs_by_state: dict[str, int]
    steps_retried: int
    """Steps dispatched more than once (attempt > 1): failed, deferred or expired before."""
    failures_counted: int
    """Sum of the steps' failure counts (expiries and exhausted retries)."""
    deferred: int
    """Step deferrals by an open circuit breaker (events with reason `deferred`)."""
    expired_recovered: int
    """Steps the supervisor found past their deadline and made pending again."""
    compensations_processed: int
    """Compensating steps (release, refund) that ran."""
    alerts_raised: int
    error_runs: list[int] = field(default_factory=list)
    compensated_runs: list[int] = field(default_factory=list)

    def state(self, name: str) -> int:
        return self.runs_by_state.get(name, 0)

    @property
    def finished(self) -> int:
        return sum(n for s, n in self.runs_by_state.items() if s in TERMINAL_RUN_STATES)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(engine: Engine, prefix: str) -> Summary:
    """The summary of the runs whose business key starts with `prefix`, in one snapshot-free
    read (the demo calls it once every role has stopped)."""
    with engine.connect() as conn:
        counts = inspect.count_prefix(conn, prefix)
    return Summary(
        orders=sum(counts.runs_by_state.values()),
        runs_by_state=dict(sorted(counts.runs_by_state.items())),
        steps_retried=counts.steps_retried,
        failures_counted=counts.failures_counted,
        deferred=counts.deferred,
        expired_recovered=counts.expired_recovered,
        compensations_processed=counts.compensations_processed,
        alerts_raised=counts.alerts_raised,
        error_runs=counts.error_runs,
        compensated_runs=counts.compensated_runs,
    )


def missing_phenomena(summary: Summary, expected_orders: int) -> list[str]:
    """What the demo is designed to show but did not happen (empty: it ran as designed)."""
    problems = []
    if summary.orders != expected_orders:
        problems.append(f"{summary.orders} runs recorded, {expected_orders} orders placed")
    if summary.finished != summary.orders:
        problems.append(f"{summary.orders - summary.finished} runs did not finish")
    expected_states = {
        RunState.COMPLETED: expected_orders - 2,
        RunState.ERROR: 1,
        RunState.COMPENSATED: 1,
    }
    for state, count in expected_states.items():
        if summary.state(state) != count:
            problems.append(f"expected {count} {state} runs, found {summary.state(state)}")
    for what, value in (
        ("a step retried", summary.steps_retried),
        ("a step deferred by an open circuit breaker", summary.deferred),
        ("an expired step recovered by the supervisor", summary.expired_recovered),
        ("a compensation", summary.compensations_processed),
        ("an alert", summary.alerts_raised),
    ):
        if value < 1:
            problems.append(f"no {what}")
    return problems
