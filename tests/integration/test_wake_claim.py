"""A wake-up's claim does not wait behind the scheduler's other duties (issue 26, W3 latency):
the NOTIFY of a submitted run is answered by claiming its step first, before the timer duty's
transaction that the same wake-up asks for.

The timer duty's transaction is made slow here (SLOW seconds while an agent's step waits to be
claimed: on the pass that a claim before it leaves none) and the rescan is a minute away, so
only a claim that runs before it can be within BOUND of the submission."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from sasflow import Registry, submit_run
from sasflow.hooks import Hooks
from sasflow.states import StepState
from sasflow.store.db import Connection, transaction
from sasflow.store.runs import timers
from sasflow.store.runs.claim import ClaimedStep
from sasflow.store.schema import steps
from sasflow.transport.topology import Names
from tests import harness
from tests.apps.basic import echo, pipeline

pytestmark = pytest.mark.integration

REGISTRY = Registry(workflows=[pipeline], agents=[echo])
SLOW = 4.0
"""Seconds the timer duty's transaction takes once the run is submitted."""
BOUND = 2.0
"""Seconds within which the run's step must be claimed (milliseconds in fact; the rest is room
for a loaded machine), well below SLOW."""


class Claims(Hooks):
    def __init__(self) -> None:
        self.claimed: list[tuple[int, float]] = []
        self.passes = 0
        """Claim statements run (empty ones too)."""

    def steps_claimed(
        self,
        conn: Connection,  # noqa: ARG002 - the hook's signature
        steps: Sequence[ClaimedStep],
        seconds: float,  # noqa: ARG002
    ) -> None:
        self.passes += 1
        self.claimed += [(s.run_id, time.monotonic()) for s in steps]


def _listening(engine: Engine) -> bool:
    """The scheduler's LISTEN connection is up (its first wake-up is then on its way)."""
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query ILIKE 'LISTEN%'"
            )
        ).scalar_one()
    return bool(found)


def test_a_wake_up_claims_before_the_timer_duty_runs(
    engine: Engine, database_url: str, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    fire_due = timers.fire_due
    timer_passes: list[float] = []

    def slow_fire_due(conn: Connection, *args: Any, **kwargs: Any) -> Any:
        timer_passes.append(time.monotonic())
        waiting = select(steps.c.id).where(
            steps.c.state == StepState.PENDING, steps.c.agent == echo.name
        )
        if conn.execute(waiting).first() is not None:
            time.sleep(SLOW)  # blocking the loop's thread as a slow statement would
        return fire_due(conn, *args, **kwargs)

    monkeypatch.setattr(timers, "fire_due", slow_fire_due)
    hooks = Claims()
    scheduler = harness.scheduler(
        engine, database_url, REGISTRY, names, hooks, rescan_interval=60.0
    )
    with harness.running(scheduler):
        # Settled: listening, its start-up wake-ups taken, and each claim's timer pass done.
        harness.wait_for(
            lambda: (
                hooks.passes > 0
                and _listening(engine)
                and not scheduler._wake.is_set()
                and len(timer_passes) >= hooks.passes
            ),
            what="the scheduler's start-up passes",
        )
        submitted = time.monotonic()
        with transaction(engine) as conn:
            run_id = submit_run(
                conn, REGISTRY, "pipeline", {"text": "t"}, namespace=names.namespace
            ).run_id
        harness.wait_for(
            lambda: any(r == run_id for r, _ in hooks.claimed), timeout=SLOW + 10, what="a claim"
        )
        claimed_at = next(at for r, at in hooks.claimed if r == run_id)
        assert claimed_at - submitted < BOUND, (
            f"claimed {claimed_at - submitted:.2f}s after the submission: behind the timer duty"
        )
        # The wake-up was passed on: the timer duty ran for it too, after the claim.
        harness.wait_for(lambda: any(t >= submitted for t in timer_passes), what="a timer pass")
