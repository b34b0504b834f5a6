"""Alert rows for the alert tests (dispatch and sinks: test_alerts.py; the CLI:
test_alerts_cli.py)."""

from __future__ import annotations

from sqlalchemy import Engine

from sasflow.store.outbox.alerts import Alert, raise_alert


def raise_alerts(engine: Engine, count: int, kind: str = "step_failed") -> list[int]:
    with engine.begin() as conn:
        ids = [
            raise_alert(
                conn,
                Alert(kind=kind, subject=f"s{i}", message=f"alert number {i}", detail={"i": i}),
            )
            for i in range(count)
        ]
    return [i for i in ids if i is not None]
