"""What every operator action shares: locking the run, the audit trail, closing its alerts."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select, update

from sasflow.errors import SasflowError
from sasflow.ops.runs import RunNotFoundError
from sasflow.store.schema import alerts, runs
from sasflow.store.sqltime import now


class InvalidActionError(SasflowError):
    """The run is not in a state where this action makes sense."""


def lock_run(conn: Connection, run_id: int) -> Any:
    """The run's row, locked against schedulers and other operators until commit."""
    run = conn.execute(select(runs).where(runs.c.id == run_id).with_for_update()).first()
    if run is None:
        raise RunNotFoundError(f"no run with id {run_id}")
    return run


def close_alerts(conn: Connection, run_id: int, *, actor: str, reason: str) -> int:
    """Acknowledge the run's open alerts: the operator acted on them."""
    return conn.execute(
        update(alerts)
        .where(alerts.c.run_id == run_id, alerts.c.acknowledged.is_(False))
        .values(
            acknowledged=True,
            acknowledged_by=actor,
            acknowledge_reason=reason,
            acknowledged_at=now(),
        )
    ).rowcount
