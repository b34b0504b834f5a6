"""Helpers of the parking tests: submit runs of tests.apps.parking, claim their steps and answer
them as an agent would, park them by running out their failures."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select, update

from sasflow import submit_run
from sasflow.commands import StepOutcome, StoredError
from sasflow.states import ReplyStatus
from sasflow.store.db import transaction
from sasflow.store.runs.apply import apply_outcomes
from sasflow.store.runs.claim import claim_steps
from sasflow.store.schema import steps
from sasflow.store.sqltime import now
from tests.apps import parking

DOWN = StoredError("ConnectionError", "partner down")


def submit(engine: Engine, workflow: str, key: str = "k") -> int:
    with engine.begin() as conn:
        return submit_run(
            conn, parking.registry, workflow, {"order": key}, key=key, namespace="t"
        ).run_id


def claim(engine: Engine) -> list[Any]:
    with engine.begin() as conn:
        conn.execute(update(steps).where(steps.c.state == "pending").values(not_before=now()))
    with transaction(engine) as conn:
        return claim_steps(conn, locked_by="s1", batch=10)


def answer(engine: Engine, kind: ReplyStatus, output: Any = None) -> None:
    """Claim the ready steps and answer each with `kind`."""
    claimed = claim(engine)
    assert claimed
    outcomes = [
        StepOutcome(
            step_id=c.id,
            attempt=c.attempt,
            kind=kind,
            output=output,
            error=None if kind is ReplyStatus.OK else DOWN,
        )
        for c in claimed
    ]
    with transaction(engine) as conn:
        apply_outcomes(conn, parking.registry, outcomes, namespace="t", actor="s1")


def park_by_failures(engine: Engine, workflow: str = "parks", key: str = "k") -> int:
    """A run of `workflow` whose step `call` parked after its two failures."""
    run_id = submit(engine, workflow, key)
    for _ in range(2):  # max_failures=2
        while step_state(engine, run_id, "call") != "pending":
            answer(engine, ReplyStatus.OK)  # earlier steps of the workflow
        answer(engine, ReplyStatus.FAILED)
    return run_id


def step_state(engine: Engine, run_id: int, name: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                select(steps.c.state).where(
                    steps.c.run_id == run_id, steps.c.name == name, steps.c.kind == "forward"
                )
            ).scalar_one()
        )
