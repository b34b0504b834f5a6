"""Recovery times of one fault, read from the state store (the database clock is this
machine's clock, so wall-clock fault times compare with `events.created_at`)."""

from __future__ import annotations

import threading
import time

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import SQLAlchemyError

from sasflow.store.schema import events, runs, steps

POLL = 0.2


def in_flight(engine: Engine) -> set[tuple[int, int]]:
    """The (step id, attempt) pairs processing now; empty if the store is unreachable."""
    try:
        with engine.connect() as conn:
            return {
                (r.id, r.attempt)
                for r in conn.execute(
                    select(steps.c.id, steps.c.attempt).where(steps.c.state == "processing")
                )
            }
    except SQLAlchemyError:
        return set()


class SettleWatch(threading.Thread):
    """Watches, from the fault's start, until every step that was in flight then is finished
    or re-queued (no longer processing under the same attempt)."""

    def __init__(
        self, engine: Engine, steps_in_flight: set[tuple[int, int]], timeout: float
    ) -> None:
        super().__init__(name="chaos-settle", daemon=True)
        self.engine = engine
        self.steps_in_flight = steps_in_flight
        self.deadline = time.monotonic() + timeout
        self.settled_at: float | None = None

    def run(self) -> None:
        ids = [step_id for step_id, _ in self.steps_in_flight]
        while time.monotonic() < self.deadline:
            try:
                with self.engine.connect() as conn:
                    still = {
                        (r.id, r.attempt)
                        for r in conn.execute(
                            select(steps.c.id, steps.c.attempt).where(
                                steps.c.id.in_(ids), steps.c.state == "processing"
                            )
                        )
                    }
            except SQLAlchemyError:
                still = self.steps_in_flight
            if not still & self.steps_in_flight:
                self.settled_at = time.time()
                return
            time.sleep(POLL)

    def result(self) -> float | None:
        """Wall-clock time it settled, or None if not before the timeout."""
        self.join(max(0.0, self.deadline - time.monotonic()) + 5)
        return self.settled_at


def first_step_done(engine: Engine, key: str, timeout: float) -> float | None:
    """Wall-clock time the first step of run `key` was processed, waiting up to `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with engine.connect() as conn:
                first = conn.execute(
                    select(func.extract("epoch", events.c.created_at))
                    .join(runs, runs.c.id == events.c.run_id)
                    .where(
                        runs.c.business_key == key,
                        events.c.entity == "step",
                        events.c.to_state == "processed",
                    )
                ).scalar()
        except SQLAlchemyError:
            first = None
        if first is not None:
            return float(first)
        time.sleep(POLL)
    return None
