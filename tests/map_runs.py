"""Runs of tests.apps.maps driven by hand (claim, apply) on the real database, to a known shape:
its map's items in the states a test wants, with no scheduler or agent running."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from sasflow.commands import NewRun, StepOutcome
from sasflow.states import ReplyStatus
from sasflow.store.db import transaction
from sasflow.store.runs.apply import apply_outcomes
from sasflow.store.runs.claim import ClaimedStep, claim_steps
from sasflow.store.runs.submit import submit
from sasflow.transport.topology import Names
from tests import services
from tests.api.server import ApiServer, api_server
from tests.apps import maps


@contextlib.contextmanager
def serving(logs: Path, database_url: str, names: Names) -> Iterator[ApiServer]:
    """`sasflow api` (and its console) for tests.apps.maps on `database_url`."""
    with api_server(
        logs,
        database_url=database_url,
        broker_url=services.broker_url(),
        namespace=names.namespace,
        app="tests.apps.maps",
    ) as server:
        yield server


def apply(engine: Engine, names: Names, outcome: StepOutcome) -> None:
    """Apply one outcome as a scheduler does; it must apply (not stale)."""
    with transaction(engine) as conn:
        report = apply_outcomes(
            conn, maps.registry, [outcome], namespace=names.namespace, actor="test"
        )
    assert report.applied == 1


def claim(engine: Engine, run_id: int) -> list[ClaimedStep]:
    """Claim what is ready of every run; the steps of `run_id`, in id order."""
    with transaction(engine) as conn:
        claimed = claim_steps(conn, locked_by="s1", batch=100)
    return sorted((s for s in claimed if s.run_id == run_id), key=lambda s: s.id)


def ok(step: ClaimedStep, output: Any = None) -> StepOutcome:
    return StepOutcome(step.id, step.attempt, ReplyStatus.OK, output=output)


def started_map(
    engine: Engine, names: Names, workflow: str, lines: int, key: str = "drain"
) -> tuple[int, list[ClaimedStep]]:
    """A run of `workflow` over `lines` lines whose map's items exist, its first ones (the
    map's parallelism, 5) claimed: the run's id and those items."""
    values = [{"sku": f"sku-{i}"} for i in range(lines)]
    with transaction(engine) as conn:
        run_id = submit(
            conn,
            maps.registry,
            NewRun(workflow=workflow, key=key, input={"lines": values}),
            namespace=names.namespace,
            actor="test",
        ).run_id
    (load,) = claim(engine, run_id)
    apply(engine, names, ok(load, {"lines": values}))
    return run_id, claim(engine, run_id)


def map_in_flight(engine: Engine, names: Names, lines: int, done: int, key: str) -> int:
    """A run of `orders` over `lines` lines with its first `done` items processed and the next
    5 processing (claimed, no reply); its id."""
    run_id, claimed = started_map(engine, names, "orders", lines, key)
    finished = 0
    while finished < done:
        step = claimed.pop(0)
        apply(engine, names, ok(step, {"index": step.name}))
        finished += 1
        claimed += claim(engine, run_id)
    return run_id
