"""The append-only event history: every run and step state change, and its publication outbox."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert

from sasflow.store.schema import events

# Step events that are not worth a status message: dispatches happen once per attempt and
# are visible in the history; notifications cover what applications act on.
QUIET_STEP_STATES = frozenset({"processing", "pending", "waiting"})


@dataclass(frozen=True)
class Event:
    """One state change, to be appended to `events`."""

    run_id: int
    entity: str
    to_state: str
    actor: str
    from_state: str | None = None
    step_id: int | None = None
    step: str | None = None
    attempt: int | None = None
    reason: str | None = None
    detail: Any = None

    def row(self) -> dict[str, Any]:
        quiet = self.entity == "step" and self.to_state in QUIET_STEP_STATES
        return {
            "run_id": self.run_id,
            "entity": self.entity,
            "to_state": self.to_state,
            "from_state": self.from_state,
            "actor": self.actor,
            "step_id": self.step_id,
            "step": self.step,
            "attempt": self.attempt,
            "reason": self.reason,
            "detail": self.detail,
            # Quiet events are born published so the relay never scans them.
            "published": quiet,
        }


def record(conn: Connection, batch: Sequence[Event]) -> None:
    """Append `batch` in one executemany."""
    if batch:
        conn.execute(insert(events), [e.row() for e in batch])
