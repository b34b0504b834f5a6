"""The demo's live news: notable events and alerts of its runs, read from the store as they
are written, plus what the simulated services report."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, func, select

from sasflow.demo.services import Happenings
from sasflow.store.schema import alerts, events, runs

STEP_NEWS = {
    "failed": "failed: retries exhausted; tried again after a backoff",
    "expired": "expired (no reply before its deadline); the supervisor made it pending again",
}
RUN_NEWS = {
    "compensating": "failed; compensating (refund, release)",
    "compensated": "compensated",
    "error": "ended in error",
    "compensation_failed": "compensation failed",
}


@dataclass(frozen=True)
class News:
    kind: str
    """retry, breaker, expiry, compensation, error, alert, outage, crash, transient."""
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
        demo = runs.c.business_key.startswith(self._prefix, autoescape=True)
        with self._engine.connect() as conn:
            top = conn.execute(select(func.max(events.c.id))).scalar_one() or 0
            rows = conn.execute(
                select(
                    events.c.entity,
                    events.c.step,
                    events.c.to_state,
                    events.c.reason,
                    events.c.attempt,
                    events.c.run_id,
                    runs.c.business_key,
                )
                .join(runs, runs.c.id == events.c.run_id)
                .where(
                    events.c.id > self._last_event,
                    events.c.id <= top,
                    demo,
                    (
                        (events.c.entity == "step")
                        & (events.c.to_state == "pending")
                        & events.c.reason.in_([*STEP_NEWS, "deferred"])
                    )
                    | ((events.c.entity == "run") & events.c.to_state.in_(list(RUN_NEWS))),
                )
                .order_by(events.c.id)
            )
            deferred: list[str] = []
            for row in rows:
                order = _order(row.business_key)
                if row.entity == "step" and row.reason == "deferred":
                    deferred.append(order)  # many at once while a breaker is open: one line
                    continue
                if row.entity == "run":
                    kind = (
                        "error"
                        if row.to_state in ("error", "compensation_failed")
                        else "compensation"
                    )
                    news.append(
                        News(kind, f"order {order} (run {row.run_id}) {RUN_NEWS[row.to_state]}")
                    )
                else:
                    kind = {"deferred": "breaker", "expired": "expiry"}.get(row.reason, "retry")
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
            self._last_event = top
            for alert in conn.execute(
                select(alerts.c.id, alerts.c.kind, alerts.c.message, alerts.c.run_id)
                .join(runs, runs.c.id == alerts.c.run_id)
                .where(alerts.c.id > self._last_alert, demo)
                .order_by(alerts.c.id)
            ):
                self._last_alert = alert.id
                news.append(
                    News("alert", f"ALERT {alert.kind} for run {alert.run_id}: {alert.message}")
                )
        return news


def _order(business_key: str) -> str:
    return business_key.rsplit("-", 1)[-1].lstrip("0") or "0"


def _short(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown}, ..."
