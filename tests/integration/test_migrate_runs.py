"""`sasflow runs migrate` on PostgreSQL (tests/apps/migrating.py: `order` v1 reserve -> charge
-> email; v2 reserve -> pay (charge renamed) -> ship (added), email dropped; v3 reserve only).

A v1 run whose `charge` is in flight is migrated to v2 with `--map charge=pay`: the step keeps
its record (id, attempt, idempotency key), its reply is applied, and the run completes with the
new graph through a real scheduler and agent. A dry run changes nothing and prints the diff. A
run whose step in flight would be dropped (v3) is refused with the reason, unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import Result
from sqlalchemy import Engine, select, update

from sasflow.commands import NewRun
from sasflow.store.db import transaction
from sasflow.store.runs.submit import submit
from sasflow.store.schema import events, runs, steps
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import migrating

pytestmark = pytest.mark.integration

Sasflow = Callable[..., Result]
MIGRATE = ("runs", "migrate", "--workflow", "order", "--reason", "v2 ships", "--by", "ops")


@pytest.fixture
def sasflow(database_url: str, names: Names) -> Sasflow:
    return harness.cli(database_url, names, "tests.apps.migrating")


@pytest.fixture
def gate() -> Iterator[None]:
    migrating.gate.clear()
    yield
    migrating.gate.set()  # never leave an agent thread waiting


def _submit(engine: Engine, names: Names, key: str) -> int:
    """A run of version 1 (the latest is 3)."""
    with transaction(engine) as conn:
        new = NewRun(workflow="order", key=key, input={"item": "book"}, version=1)
        return submit(conn, migrating.registry, new, namespace=names.namespace, actor="t").run_id


def _steps(engine: Engine, run_id: int) -> dict[str, Any]:
    return {r.name: r for r in harness.step_rows(engine, run_id)}


def _run(engine: Engine, run_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).one()


def _hold_in_flight(engine: Engine, run_id: int, name: str) -> None:
    """Make `name` look dispatched (processing, attempt 1) without a scheduler: the
    migration's refusal reads the record, not who holds it."""
    with engine.begin() as conn:
        conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.name == name)
            .values(state="processing", attempt=1, locked_by="test")
        )


def test_a_run_in_flight_moves_to_v2_and_completes_with_the_new_graph(
    engine: Engine, database_url: str, names: Names, sasflow: Sasflow, gate: None
) -> None:
    run_id = _submit(engine, names, "mid-flight")
    with harness.running(
        harness.scheduler(engine, database_url, migrating.registry, names, rescan_interval=0.1),
        harness.agent(migrating.shop, names),
    ):
        harness.wait_for(
            lambda: _steps(engine, run_id)["charge"].state == "processing",
            what="charge in flight",
        )
        charge = _steps(engine, run_id)["charge"]
        result = sasflow(
            *MIGRATE,
            "--from-version",
            "1",
            "--to-version",
            "2",
            "--map",
            "charge=pay",
            "--yes",
            "-o",
            "json",
        )
        assert result.exit_code == 0, result.output
        [migrated] = json.loads(result.stdout)["runs"]
        assert migrated == {
            "run_id": run_id,
            "migrated": True,
            "refused": None,
            "state": "running",
            "added": ["ship"],
            "renamed": {"charge": "pay"},
            "kept": ["pay", "reserve"],
            "removed": ["email"],
            "history": [],
        }
        pay = _steps(engine, run_id)["pay"]
        assert (pay.id, pay.state, pay.attempt, pay.idempotency_key) == (
            charge.id,
            "processing",
            1,
            charge.idempotency_key,
        )
        assert set(_steps(engine, run_id)) == {"reserve", "pay", "ship"}
        assert _steps(engine, run_id)["ship"].state == "waiting"
        migrating.gate.set()  # charge answers: its reply lands on `pay`
        harness.wait_for(lambda: _run(engine, run_id).state == "completed", what="completed")
    finished = _steps(engine, run_id)
    assert {n: s.state for n, s in finished.items()} == {
        "reserve": "processed",
        "pay": "processed",
        "ship": "processed",
    }
    assert finished["pay"].output["key"] == charge.idempotency_key
    assert finished["ship"].input == finished["pay"].output
    assert _run(engine, run_id).version == 2
    with engine.connect() as conn:
        audited = conn.execute(
            select(events.c.actor, events.c.reason, events.c.detail).where(
                events.c.run_id == run_id, events.c.reason.like("migrated%")
            )
        ).one()
    assert audited.actor == "ops"
    assert audited.reason == "migrated from version 1 to 2: v2 ships"
    assert audited.detail["renamed"] == {"charge": "pay"}


def test_a_dry_run_prints_the_diff_and_changes_nothing(
    engine: Engine, names: Names, sasflow: Sasflow
) -> None:
    run_id = _submit(engine, names, "dry")
    before = (_run(engine, run_id), harness.step_rows(engine, run_id))
    result = sasflow(
        *MIGRATE, "--from-version", "1", "--to-version", "2", "--map", "charge=pay", "--dry-run"
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"run {run_id} (pending) would be: + ship; pay <- charge; - email",
        "would migrate 1 of 1 run(s) to version 2",
    ]
    assert (_run(engine, run_id), harness.step_rows(engine, run_id)) == before


def test_a_run_whose_step_in_flight_would_be_dropped_is_refused_with_the_reason(
    engine: Engine, names: Names, sasflow: Sasflow
) -> None:
    run_id = _submit(engine, names, "refused")
    _hold_in_flight(engine, run_id, "reserve")
    other = _submit(engine, names, "fine")  # not started: nothing of it is in flight
    _hold_in_flight(engine, run_id, "charge")
    before = (_run(engine, run_id), harness.step_rows(engine, run_id))
    result = sasflow(*MIGRATE, "--from-version", "1", "--to-version", "3", "--yes")
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[0] == (
        f"run {run_id}: refused: version 3 has no step for 'charge' (processing, attempt 1): "
        "a step in flight or whose outcome is unknown is never dropped; wait for it to end, "
        "or --map it to a step of version 3"
    )
    assert f"refused run(s): {run_id}" in result.stderr
    assert (_run(engine, run_id), harness.step_rows(engine, run_id)) == before
    assert _run(engine, other).version == 3
    assert set(_steps(engine, other)) == {"reserve"}
