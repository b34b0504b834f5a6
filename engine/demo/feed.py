"""The demo's live news: notable events and alerts of its runs, read from the store as they
are written, plus what the simulated services report."""

from __future__ import annotations

from dataclasses import dataclass

from sasflow.demo.services import Happenings
from sasflow.states import RunState
from sasflow.store.db import Engine
from sasflow.store.operator import inspect

STEP_NEWS = {
    "failed": "failed: retries exhausted; tried again after a backoff",
    "expired": "expired (no reply before its deadline); the supervisor made it pending again",
    "wait expired": "waited for an agent past its wait timeout; pending again, no failure counted",
}
RUN_NEWS = {
    RunState.COMPENSATING: "failed; compensating (refund, release)",
    RunState.COMPENSATED: "compensated",
    RunState.ERROR: "ended in error",
    RunState.COMPENSATION_FAILED: "compensation failed",
}
WAIT_NEWS = {
    "event wait": "waiting for their payment confirmation (payment_confirmed)",
    "timer": "cooling off before shipping (a timer)",
}
"""Steps that wait on the schedulers, not an agent: one line per poll for each reason."""
TIMED_OUT = "event timeout"
"""The reason of an event wait that timed out (one line per order)."""
FAILED_RUN_STATES = frozenset({RunState.ERROR, RunState.COMPENSATION_FAILED})


@dataclass(frozen=True)
class News:
    kind: str
    """retry, breaker, expiry, compensation, error, alert, outage, crash, transient, event."""
    text: str


class StoreFeed:
    """Polls `events` and `alerts` for the runs whose business key starts with `prefix`."""

    def __init__(
        self,
        engine: Engine,
        prefix: str,
        happenings: Happenings | None = None,
    ) -> None:
        self._engine = engine
        self._prefix = prefix
        self._happenings = happenings
        self._last_event = 0
        self._last_alert = 0

    def poll(self) -> list[News]:
        news: list[News] = []
        if self._happenings is not None:
            happened = self._happenings.take()
            news.extend(News(h.kind, h.message) for h in happened if h.kind != "transient")
            transient = sum(1 for h in happened if h.kind == "transient")
            if transient:  # too many to list one by one
                news.append(
                    News(
                        "transient", f"payment gateway errors retried inside the agent: {transient}"
                    )
                )
        with self._engine.connect() as conn:
            top = inspect.last_event_id(conn)
            rows = inspect.prefix_events(
                conn,
                self._prefix,
                after=self._last_event,
                up_to=top,
                step_reasons=[*STEP_NEWS, "deferred", *WAIT_NEWS],
                ended_reasons=[TIMED_OUT],
                run_states=list(RUN_NEWS),
            )
            deferred: list[str] = []
            waiting: dict[str, list[str]] = {reason: [] for reason in WAIT_NEWS}
            for row in rows:
                order = _order(row.business_key)
                if row.entity == "step" and row.reason in WAIT_NEWS:
                    waiting[row.reason].append(order)
                    continue
                if row.entity == "step" and row.reason == TIMED_OUT:
                    news.append(
                        News(
                            "event",
                            f"order {order} (run {row.run_id}): no payment confirmation within "
                            f"its wait's timeout; {row.step} timed out, its on_timeout applies",
                        )
                    )
                    continue
                if row.entity == "step" and row.reason == "deferred":
                    deferred.append(order)  # many at once while a breaker is open: one line
                    continue
                if row.entity == "run":
                    kind = "error" if row.to_state in FAILED_RUN_STATES else "compensation"
                    news.append(
                        News(kind, f"order {order} (run {row.run_id}) {RUN_NEWS[row.to_state]}")
                    )
                else:
                    kind = {
                        "deferred": "breaker",
                        "expired": "expiry",
                        "wait expired": "expiry",
                    }.get(row.reason, "retry")
                    news.append(
                        News(
                            kind,
                            f"order {order} (run {row.run_id}) step {row.step} "
                            f"attempt {row.attempt} {STEP_NEWS[row.reason]}",
                        )
                    )
            if deferred:
                news.append(
                    News(
                        "breaker",
                        f"{len(deferred)} steps deferred, circuit breaker "
                        f"open (orders {_short(deferred)})",
                    )
                )
            for reason, orders in waiting.items():
                if orders:
                    news.append(
                        News("event", f"{_orders(orders)} {WAIT_NEWS[reason]}: {_short(orders)}")
                    )
            self._last_event = top
            for alert in inspect.prefix_alerts(conn, self._prefix, after=self._last_alert):
                self._last_alert = alert.id
                news.append(
                    News("alert", f"ALERT {alert.kind} for run {alert.run_id}: {alert.message}")
                )
        return news


def _order(business_key: str) -> str:
    return business_key.rsplit("-", 1)[-1].lstrip("0") or "0"


def _orders(orders: list[str]) -> str:
    return "1 order" if len(orders) == 1 else f"{len(orders)} orders"


def _short(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown}, ..."
