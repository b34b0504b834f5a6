"""What every operator action shares: locking the run, closing its alerts."""

from __future__ import annotations

from typing import Any

from sasflow.errors import RunNotFoundError
from sasflow.store.db import Connection
from sasflow.store.operator import transitions as operator


def lock_run(conn: Connection, run_id: int) -> Any:
    """The run's row, locked against schedulers and other operators until commit."""
    run = operator.lock_run(conn, run_id)
    if run is None:
        raise RunNotFoundError(f"no run with id {run_id}")
    return run


def close_alerts(conn: Connection, run_id: int, *, actor: str, reason: str) -> int:
    """Acknowledge the run's open alerts: the operator acted on them."""
    return operator.acknowledge_run_alerts(conn, run_id, actor=actor, reason=reason)
