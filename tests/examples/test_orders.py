"""examples/orders: the demo's orders with lines (a map step) and a shipping child workflow, as
separate processes started by its run.sh (Procfile)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from examples.orders.shop import amount
from sasflow.demo.scenario import Scenario
from sasflow.store.schema import alerts, runs, steps
from sasflow.transport.topology import Names
from tests import harness, services
from tests.acceptance.processes import REPO

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

ORDERS = 20


def _environment(database_url: str, names: Names) -> dict[str, str]:
    return {
        **os.environ,
        "SASFLOW_DATABASE_URL": database_url,
        "SASFLOW_BROKER_URL": services.broker_url(),
        "SASFLOW_NAMESPACE": names.namespace,
        "PYTHONPATH": str(REPO),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


@contextlib.contextmanager
def _run_sh(log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """examples/orders/run.sh in its own process group, killed whatever happens."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", str(REPO / "examples/orders/run.sh")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_orders_example_runs_as_separate_processes_and_stops_on_sigterm(
    tmp_path: Path, engine: Engine, database_url: str, names: Names
) -> None:
    """Orders placed on the submission queue end as the scenario says (one error with an
    alert, two compensated: the address refused and the express payment never confirmed, the
    rest completed, the crashed dispatch recovered), every line reserved once by an item of the
    order's map, shipping run as a child linked to its order; SIGTERM stops run.sh and every
    process it started."""
    env = _environment(database_url, names)
    log = tmp_path / "run.log"
    with _run_sh(log, env) as run_sh:
        placed = subprocess.run(
            [sys.executable, "-m", "examples.orders.place_orders", "--orders", str(ORDERS)],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert placed.returncode == 0, placed.stderr
        prefix = json.loads(placed.stdout)["key_prefix"]
        # The partner confirms the payments: most events arrive before their waits open.
        confirming = subprocess.run(
            [
                sys.executable,
                "-m",
                "examples.orders.confirm_payments",
                "--key-prefix",
                prefix,
                "--orders",
                str(ORDERS),
            ],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert confirming.returncode == 0, confirming.stderr
        assert json.loads(confirming.stdout) == {"confirmed": ORDERS - 2, "key_prefix": prefix}
        harness.wait_for(
            # The orders, and a shipping child for each but the two that never ship.
            harness.all_runs_in(engine, {"completed", "error", "compensated"}, 2 * ORDERS - 2),
            timeout=90,
            interval=0.2,
            what=f"{ORDERS} orders and their shipping children finished",
        )
        assert run_sh.poll() is None, log.read_text()
        run_sh.send_signal(signal.SIGTERM)
        assert run_sh.wait(30) == 0, log.read_text()
        harness.wait_for(
            lambda: _group_gone(run_sh.pid), timeout=10, what="every process of run.sh stopped"
        )
    assert "run.sh: stopped" in log.read_text()

    _check_outcomes(engine, Scenario.build(ORDERS), prefix)


def _check_outcomes(engine: Engine, scenario: Scenario, prefix: str) -> None:
    """What the database says of the orders and their shipping children."""
    with engine.connect() as conn:
        all_runs = conn.execute(select(runs).order_by(runs.c.id)).all()
        all_steps = conn.execute(select(steps).order_by(steps.c.id)).all()
        alert_runs = list(conn.execute(select(alerts.c.run_id)).scalars())
    orders = {r.id: r for r in all_runs if r.parent_run_id is None}
    children = {r.parent_run_id: r for r in all_runs if r.parent_run_id is not None}
    by_number = {r.input["order"]: r for r in orders.values()}
    steps_of: dict[int, list[Any]] = {}
    for step in all_steps:
        steps_of.setdefault(step.run_id, []).append(step)

    def state_counts(rows: Iterable[Any]) -> dict[str, int]:
        return dict(Counter(str(r.state) for r in rows))

    assert len(orders) == ORDERS
    assert state_counts(orders.values()) == {"completed": ORDERS - 3, "error": 1, "compensated": 2}
    failed = by_number[scenario.declined]
    assert failed.state == "error"
    assert alert_runs == [failed.id]
    # The undeliverable order, and the express order whose payment was never confirmed (its
    # wait timed out).
    assert {n for n, r in by_number.items() if r.state == "compensated"} == {
        scenario.undeliverable,
        scenario.unconfirmed,
    }

    # Every order's lines were reserved once per line, in items of its map, each processed.
    for order in orders.values():
        items = [s for s in steps_of[order.id] if s.map_parent is not None]
        lines = order.input["lines"]
        assert [(s.name, s.map_index, s.map_size) for s in items] == [
            (f"reserve[{i}]", i, len(lines)) for i in range(len(lines))
        ]
        assert [s.input for s in items] == lines
        assert all(s.state == "processed" and s.output["line"] == s.map_index for s in items)
        (reserve,) = [s for s in steps_of[order.id] if s.name == "reserve"]
        assert (reserve.state, reserve.output) == ("processed", [s.output for s in items])

    # The payment waits: confirmed for all but the declined and the unconfirmed orders.
    confirmed = {
        orders[s.run_id].business_key: s
        for s in all_steps
        if s.run_id in orders and s.name == "payment_confirmed" and s.state == "processed"
    }
    assert set(confirmed) == {f"{prefix}{n:05d}" for n in range(1, ORDERS + 1)} - {
        f"{prefix}{scenario.declined:05d}",
        f"{prefix}{scenario.unconfirmed:05d}",
    }
    for key, step in confirmed.items():
        order = orders[step.run_id]
        assert step.output == {
            "order_id": key,
            "amount": amount(order.input),
            "status": "confirmed",
        }
        (cool_off,) = [s for s in steps_of[order.id] if s.name == "cool_off"]
        assert cool_off.state == "processed"
    (timed_out,) = [
        s.run_id for s in all_steps if s.name == "payment_confirmed" and s.state == "error"
    ]
    assert timed_out == by_number[scenario.unconfirmed].id

    # A shipping child for every order that got to ship, linked to its parent and its step.
    assert set(children) == {
        o.id for o in orders.values() if o.id in {s.run_id for s in confirmed.values()}
    }
    for parent_id, child in children.items():
        (ship,) = [s for s in steps_of[parent_id] if s.name == "ship"]
        assert (child.workflow, child.parent_step, child.input) == (
            "shipping",
            "ship",
            orders[parent_id].input,
        )
        assert ship.input == {"child": {"run_id": child.id, "workflow": "shipping"}}
        if child.state == "completed":
            assert (ship.state, ship.output) == ("processed", child.output)
            shipped = {s.name: s for s in steps_of[child.id]}
            gift = child.input["gift"]
            assert shipped["gift_wrap"].state == ("processed" if gift else "skipped")
            assert all(shipped[n].state == "processed" for n in ("pack", "label", "dispatch"))
    assert state_counts(children.values()) == {"completed": ORDERS - 3, "compensated": 1}
    undelivered = children[by_number[scenario.undeliverable].id]
    assert undelivered.state == "compensated"
    assert {s.name for s in steps_of[undelivered.id] if s.state == "error"} == {"label"}
    assert _undone(steps_of[undelivered.id]) == ["pack"]  # no label to void: it failed
    assert any(c.input["gift"] for c in children.values() if c.state == "completed")

    # A compensated order refunded its charge, then released every line in reverse order.
    for number in (scenario.undeliverable, scenario.unconfirmed):
        order = by_number[number]
        lines = len(order.input["lines"])
        assert _undone(steps_of[order.id]) == ["charge"] + [
            f"reserve[{i}]" for i in reversed(range(lines))
        ]
    assert len(by_number[scenario.undeliverable].input["lines"]) == 3

    # The crashed dispatch: expired, then done by another attempt.
    crashed = children[by_number[scenario.crash].id]
    (dispatch,) = [s for s in steps_of[crashed.id] if s.name == "dispatch"]
    assert (dispatch.state, dispatch.failure_count) == ("processed", 1)


def _undone(run_steps: list[Any]) -> list[str]:
    """The names of a run's processed compensation records, in the order they were made."""
    return [s.name for s in run_steps if s.kind == "compensation" and s.state == "processed"]
