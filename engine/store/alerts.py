"""Raise operator alerts: one open alert per subject and kind, delivered later by the sinks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

from sasflow.store.dialect import upsert_insert
from sasflow.store.schema import alerts

STEP_FAILED = "step_failed"
COMPENSATION_FAILED = "compensation_failed"
STALLED = "stalled"


@dataclass(frozen=True)
class Alert:
    """Something an operator must look at."""

    kind: str
    subject: str
    """What the alert is about (a step id, an agent...): with `kind`, the deduplication key."""
    message: str
    run_id: int | None = None
    step_id: int | None = None
    detail: Any = None

    @property
    def dedup_key(self) -> str:
        return f"{self.kind}:{self.subject}"[:200]


def raise_alert(conn: Connection, alert: Alert) -> int | None:
    """Insert `alert` unless the same one is open already; returns its id when it is new."""
    return conn.execute(
        upsert_insert(conn, alerts)
        .values(
            kind=alert.kind,
            dedup_key=alert.dedup_key,
            message=alert.message,
            run_id=alert.run_id,
            step_id=alert.step_id,
            detail=alert.detail,
        )
        .on_conflict_do_nothing(
            index_elements=[alerts.c.dedup_key], index_where=text("NOT acknowledged")
        )
        .returning(alerts.c.id)
    ).scalar_one_or_none()
