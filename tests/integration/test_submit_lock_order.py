"""Two submission batches with keys in common, in opposite orders, recorded at the same time on
PostgreSQL: each path (one statement, portable) records runs in (workflow, key) order, so one
transaction waits for the other and none dies of a deadlock (store.submit.record_runs)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from sqlalchemy import Engine, func, select

from sasflow.commands import NewRun, Refused
from sasflow.store.dialect import capabilities, with_capabilities
from sasflow.store.runs.submit import record_runs
from sasflow.store.schema import runs
from tests.apps import basic

pytestmark = pytest.mark.integration

KEYS = 150
"""Keys per batch: enough that two batches in opposite orders meet in the middle."""

TRIES = 5


def _record(
    engine: Engine, keys: Sequence[str], barrier: threading.Barrier
) -> BaseException | None:
    try:
        with engine.begin() as conn:
            barrier.wait(timeout=60)
            answers = record_runs(
                conn,
                basic.registry,
                [NewRun("pipeline", {"text": k}, key=k) for k in keys],
                namespace="t",
                actor="tester",
            )
        assert not any(isinstance(a, Refused) for a in answers)
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        return exc
    return None


def _both_at_once(engine: Engine, prefix: str) -> list[BaseException]:
    keys = [f"{prefix}-{i:04d}" for i in range(KEYS)]
    barrier = threading.Barrier(2)
    errors: list[BaseException | None] = [None, None]

    def one(slot: int, order: Sequence[str]) -> None:
        errors[slot] = _record(engine, order, barrier)

    threads = [
        threading.Thread(target=one, args=(0, keys)),
        threading.Thread(target=one, args=(1, keys[::-1])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return [e for e in errors if e is not None]


@pytest.mark.parametrize("path", ["one statement", "portable"])
def test_opposite_orders_of_the_same_keys_do_not_deadlock(engine: Engine, path: str) -> None:
    bind = engine
    if path == "portable":
        bind = with_capabilities(engine, capabilities(engine).portable())
    for attempt in range(TRIES):
        errors = _both_at_once(bind, f"{path[0]}{attempt}")
        assert errors == [], f"try {attempt}: {errors!r}"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(runs)).scalar_one() == KEYS * TRIES
