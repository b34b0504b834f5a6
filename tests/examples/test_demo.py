"""`sasflow demo` as a user runs it: a subprocess, on the real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from sasflow.demo.app import EXPRESS_WAIT_S
from sasflow.demo.scenario import Scenario
from sasflow.store.db import make_engine
from sasflow.store.schema import alerts, events, inbound_events, runs, steps
from sasflow.transport.topology import Names
from tests.acceptance.processes import processes

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

ORDERS = 50


def _store_counts(engine: Engine) -> dict[str, Any]:
    """The summary's figures, counted here with queries of the test's own."""
    with engine.connect() as conn:
        by_state = {
            str(row.state): int(row.n)
            for row in conn.execute(
                select(runs.c.state, func.count().label("n")).group_by(runs.c.state)
            )
        }

        def count(table: Any, *where: Any) -> int:
            return int(
                conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()
            )

        return {
            "orders": count(runs),
            "runs_by_state": by_state,
            "steps_retried": count(steps, steps.c.attempt > 1),
            "failures_counted": int(
                conn.execute(select(func.coalesce(func.sum(steps.c.failure_count), 0))).scalar_one()
            ),
            "deferred": count(
                events, events.c.reason == "deferred", events.c.to_state == "pending"
            ),
            "expired_recovered": count(
                events, events.c.reason == "expired", events.c.to_state == "pending"
            ),
            "compensations_processed": count(
                steps, steps.c.kind == "compensation", steps.c.state == "processed"
            ),
            "alerts_raised": count(alerts),
            "timers_fired": count(
                events, events.c.reason == "timer", events.c.to_state == "processed"
            ),
            "events_matched": count(
                events, events.c.reason == "event", events.c.to_state == "processed"
            ),
            "events_before_wait": int(
                conn.execute(
                    select(func.count())
                    .select_from(inbound_events)
                    .join(
                        events,
                        (events.c.step_id == inbound_events.c.consumed_step_id)
                        & (events.c.reason == "event wait"),
                    )
                    .where(inbound_events.c.received_at < events.c.created_at)
                ).scalar_one()
            ),
            "event_timeouts": count(events, events.c.reason == "event timeout"),
            "error_runs": list(
                conn.execute(
                    select(runs.c.id).where(runs.c.state == "error").order_by(runs.c.id)
                ).scalars()
            ),
            "compensated_runs": list(
                conn.execute(
                    select(runs.c.id).where(runs.c.state == "compensated").order_by(runs.c.id)
                ).scalars()
            ),
        }


def _as_utc(moment: datetime) -> datetime:
    """SQLite hands its times back naive (they are UTC)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _assert_waited_and_slept(engine: Engine, expected: dict[str, Any]) -> None:
    """Every order past its charge (all but the declined one) waited for its payment
    confirmation; all but the express order whose confirmation the provider withholds got the
    provider's payload as the step's output, and cooled off; the early confirmation was stored
    before its wait opened, and matched; the express order's wait timed out after its 4 s (on
    the database clock) and the order was compensated (refund, release)."""
    scenario = Scenario.build(ORDERS)
    assert expected["events_matched"] == expected["timers_fired"] == ORDERS - 2
    # The early one at least; a confirmation sent 0.1 s after its charge may beat the wait too
    # on a loaded machine (its charge's reply not yet processed).
    assert expected["events_before_wait"] >= 1
    assert expected["event_timeouts"] == 1
    with engine.connect() as conn:
        express = conn.execute(
            select(runs.c.id, runs.c.state, runs.c.workflow, steps.c.state.label("wait"))
            .join(steps, steps.c.run_id == runs.c.id)
            .where(
                runs.c.business_key.endswith(f"-{scenario.unconfirmed:05d}"),
                steps.c.name == "payment_confirmed",
            )
        ).one()
        timed_out = conn.execute(
            select(events.c.created_at, events.c.to_state)
            .where(
                events.c.step_id
                == select(steps.c.id)
                .where(steps.c.run_id == express.id, steps.c.name == "payment_confirmed")
                .scalar_subquery(),
                events.c.reason.in_(("event wait", "event timeout")),
            )
            .order_by(events.c.id)
        ).all()
        undone = list(
            conn.execute(
                select(steps.c.name)
                .where(
                    steps.c.run_id == express.id,
                    steps.c.kind == "compensation",
                    steps.c.state == "processed",
                )
                .order_by(steps.c.id)
            ).scalars()
        )
    assert (express.workflow, express.state, express.wait) == (
        "express-order",
        "compensated",
        "error",
    )
    (opened, _), (ended, to_state) = timed_out
    assert to_state == "error"
    assert _as_utc(ended) - _as_utc(opened) >= timedelta(seconds=EXPRESS_WAIT_S)
    assert express.id in expected["compensated_runs"]
    assert undone == ["charge", "reserve"]  # refund first, then release
    with engine.connect() as conn:
        rows = conn.execute(
            select(runs.c.business_key, runs.c.input, runs.c.state, steps.c.name, steps.c.output)
            .join(steps, steps.c.run_id == runs.c.id)
            .where(
                steps.c.name.in_(("payment_confirmed", "cool_off")),
                steps.c.state == "processed",
            )
        ).all()
        stored_first = conn.execute(
            select(inbound_events, runs.c.input)
            .join(steps, steps.c.id == inbound_events.c.consumed_step_id)
            .join(runs, runs.c.id == steps.c.run_id)
            .join(
                events,
                (events.c.step_id == steps.c.id) & (events.c.reason == "event wait"),
            )
            .where(inbound_events.c.received_at < events.c.created_at)
        ).all()
    confirmed = {r.business_key: r for r in rows if r.name == "payment_confirmed"}
    cooled = {r.business_key for r in rows if r.name == "cool_off"}
    assert len(confirmed) == ORDERS - 2
    assert cooled == set(confirmed)
    for key, row in confirmed.items():
        assert row.input["order_id"] == key
        assert row.output == {
            "order_id": key,
            "amount": row.input["qty"] * row.input["unit_price"],
            "status": "confirmed",
        }
    assert all(r.state in ("completed", "compensated") for r in confirmed.values())
    assert len(stored_first) == expected["events_before_wait"]
    early = [r for r in stored_first if r.input["order"] == scenario.early]
    assert len(early) == 1
    assert (early[0].name, early[0].correlation) == (
        "payment_confirmed",
        early[0].input["order_id"],
    )


def test_demo_of_50_orders_exits_0_and_its_summary_equals_the_store(
    tmp_path: Path, engine: Engine, database_url: str, names: Names
) -> None:
    """Every phenomenon the demo promises shows in the store, and the summary it prints is
    exactly what the store holds; the non-terminal output carries no control codes."""
    summary_file = tmp_path / "summary.json"
    with processes(tmp_path, database_url=database_url, namespace=names.namespace) as procs:
        result = procs.run(
            "demo", "--orders", str(ORDERS), "--summary-file", str(summary_file), timeout=150
        )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(summary_file.read_text())
    expected = _store_counts(engine)
    assert {k: summary[k] for k in expected} == expected
    assert expected["runs_by_state"] == {"completed": ORDERS - 3, "error": 1, "compensated": 2}
    assert expected["steps_retried"] >= 1
    assert expected["deferred"] >= 1
    assert expected["expired_recovered"] >= 1
    assert expected["compensations_processed"] == 4  # refund, then release, twice
    assert expected["alerts_raised"] == 1
    assert summary["problems"] == []
    assert summary["namespace"] == names.namespace
    _assert_waited_and_slept(engine, expected)

    scenario = Scenario.build(ORDERS)
    with engine.connect() as conn:
        failed = conn.execute(select(runs).where(runs.c.state == "error")).one()
        alert = conn.execute(select(alerts)).one()
        crashed_ship = conn.execute(
            select(steps)
            .join(runs, runs.c.id == steps.c.run_id)
            .where(runs.c.business_key.endswith(f"-{scenario.crash:05d}"), steps.c.name == "ship")
        ).one()
    assert failed.input["order"] == scenario.declined
    assert failed.error["error"]["message"] == "card declined by the issuer"
    assert (alert.kind, alert.run_id) == ("step_failed", failed.id)
    assert (crashed_ship.state, crashed_ship.failure_count) == ("processed", 1)
    assert crashed_ship.attempt >= 2

    assert f"runs show {failed.id}" in result.stdout
    assert "\x1b[" not in result.stdout


def test_demo_by_default_runs_on_a_fresh_sqlite_file_and_the_in_process_bus(
    tmp_path: Path,
) -> None:
    """No service settings: the demo recreates ./sasflow-demo.db, runs on the in-process bus,
    exits 0, and its summary equals what the file holds afterwards."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SASFLOW_DATABASE_URL", "SASFLOW_BROKER_URL", "SASFLOW_NAMESPACE")
    }
    database = tmp_path / "sasflow-demo.db"
    database.write_text("not a database: the demo must replace it")
    summary_file = tmp_path / "summary.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sasflow",
            "demo",
            "--orders",
            str(ORDERS),
            "--summary-file",
            str(summary_file),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(summary_file.read_text())
    assert summary["database_url"] == "sqlite:///sasflow-demo.db"
    assert summary["namespace"] == "sasflow-demo"
    engine = make_engine(f"sqlite:///{database}")
    try:
        expected = _store_counts(engine)
    finally:
        engine.dispose()
    assert {k: summary[k] for k in expected} == expected
    assert expected["runs_by_state"] == {"completed": ORDERS - 3, "error": 1, "compensated": 2}
    assert min(expected["steps_retried"], expected["deferred"], expected["expired_recovered"]) >= 1
    assert (expected["compensations_processed"], expected["alerts_raised"]) == (4, 1)
    engine = make_engine(f"sqlite:///{database}")
    try:
        _assert_waited_and_slept(engine, expected)
    finally:
        engine.dispose()
    failed = expected["error_runs"][0]
    assert f"sasflow --database-url sqlite:///sasflow-demo.db runs show {failed}" in result.stdout


def test_demo_refuses_too_few_orders_before_touching_any_service() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sasflow",
            "--database-url",
            "postgresql+psycopg://nobody@127.0.0.1:1/none",
            "demo",
            "--orders",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "Invalid value for '--orders'" in result.stderr
