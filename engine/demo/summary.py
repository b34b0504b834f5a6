"""What the demo did, read back from the state store (never from the roles' own counters).

The demo's runs are those whose business key starts with the demo's prefix, so a demo run
against a shared database counts only its own orders.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, func, select

from sasflow.store.schema import alerts, events, runs, steps

TERMINAL_RUN_STATES = frozenset(
    {"completed", "error", "compensated", "compensation_failed", "cancelled"}
)


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


def _demo_runs(prefix: str) -> Any:
    return select(runs.c.id).where(runs.c.business_key.startswith(prefix, autoescape=True))


def run_states(conn: Connection, prefix: str) -> dict[str, int]:
    rows = conn.execute(
        select(runs.c.state, func.count())
        .where(runs.c.business_key.startswith(prefix, autoescape=True))
        .group_by(runs.c.state)
    )
    return {str(state): int(count) for state, count in rows}


def summarize(engine: Engine, prefix: str) -> Summary:
    """The summary of the runs whose business key starts with `prefix`, in one snapshot-free
    read (the demo calls it once every role has stopped)."""
    ids = _demo_runs(prefix).scalar_subquery()
    with engine.connect() as conn:
        by_state = run_states(conn, prefix)
        retried = conn.execute(
            select(func.count())
            .select_from(steps)
            .where(steps.c.run_id.in_(ids), steps.c.attempt > 1)
        ).scalar_one()
        failures = conn.execute(
            select(func.coalesce(func.sum(steps.c.failure_count), 0)).where(steps.c.run_id.in_(ids))
        ).scalar_one()

        def step_events(reason: str) -> int:
            return int(
                conn.execute(
                    select(func.count())
                    .select_from(events)
                    .where(
                        events.c.run_id.in_(ids),
                        events.c.entity == "step",
                        events.c.reason == reason,
                        events.c.to_state == "pending",
                    )
                ).scalar_one()
            )

        compensations = conn.execute(
            select(func.count())
            .select_from(steps)
            .where(
                steps.c.run_id.in_(ids),
                steps.c.kind == "compensation",
                steps.c.state == "processed",
            )
        ).scalar_one()
        raised = conn.execute(
            select(func.count()).select_from(alerts).where(alerts.c.run_id.in_(ids))
        ).scalar_one()

        def ids_in(state: str) -> list[int]:
            return list(
                conn.execute(
                    select(runs.c.id)
                    .where(
                        runs.c.business_key.startswith(prefix, autoescape=True),
                        runs.c.state == state,
                    )
                    .order_by(runs.c.id)
                ).scalars()
            )

        return Summary(
            orders=sum(by_state.values()),
            runs_by_state=dict(sorted(by_state.items())),
            steps_retried=int(retried),
            failures_counted=int(failures),
            deferred=step_events("deferred"),
            expired_recovered=step_events("expired"),
            compensations_processed=int(compensations),
            alerts_raised=int(raised),
            error_runs=ids_in("error"),
            compensated_runs=ids_in("compensated"),
        )


def missing_phenomena(summary: Summary, expected_orders: int) -> list[str]:
    """What the demo is designed to show but did not happen (empty: it ran as designed)."""
    problems = []
    if summary.orders != expected_orders:
        problems.append(f"{summary.orders} runs recorded, {expected_orders} orders placed")
    if summary.finished != summary.orders:
        problems.append(f"{summary.orders - summary.finished} runs did not finish")
    expected_states = {"completed": expected_orders - 2, "error": 1, "compensated": 1}
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
