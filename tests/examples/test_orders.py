"""examples/orders: the demo's app as separate processes, started by its run.sh (Procfile)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

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
    rest completed, the crashed shipment recovered); SIGTERM
    stops run.sh and every process it started."""
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
            harness.all_runs_in(engine, {"completed", "error", "compensated"}, ORDERS),
            timeout=60,
            interval=0.2,
            what=f"{ORDERS} orders finished",
        )
        assert run_sh.poll() is None, log.read_text()
        run_sh.send_signal(signal.SIGTERM)
        assert run_sh.wait(30) == 0, log.read_text()
        harness.wait_for(
            lambda: _group_gone(run_sh.pid), timeout=10, what="every process of run.sh stopped"
        )
    assert "run.sh: stopped" in log.read_text()

    scenario = Scenario.build(ORDERS)
    with engine.connect() as conn:
        states = {
            str(r.state): int(r.n)
            for r in conn.execute(
                select(runs.c.state, func.count().label("n")).group_by(runs.c.state)
            )
        }
        failed = conn.execute(select(runs).where(runs.c.state == "error")).one()
        compensated = conn.execute(
            select(runs).where(runs.c.state == "compensated").order_by(runs.c.id)
        ).all()
        timed_out = conn.execute(
            select(steps.c.run_id).where(
                steps.c.name == "payment_confirmed", steps.c.state == "error"
            )
        ).scalar_one()
        undone = list(
            conn.execute(
                select(steps.c.name)
                .where(
                    steps.c.run_id.in_([r.id for r in compensated]),
                    steps.c.kind == "compensation",
                    steps.c.state == "processed",
                )
                .order_by(steps.c.run_id, steps.c.id)
            ).scalars()
        )
        alert_runs = list(conn.execute(select(alerts.c.run_id)).scalars())
        crashed_ship = conn.execute(
            select(steps)
            .join(runs, runs.c.id == steps.c.run_id)
            .where(runs.c.business_key.endswith(f"-{scenario.crash:05d}"), steps.c.name == "ship")
        ).one()
        waited = conn.execute(
            select(runs.c.business_key, runs.c.input, steps.c.name, steps.c.output)
            .join(steps, steps.c.run_id == runs.c.id)
            .where(
                steps.c.name.in_(("payment_confirmed", "cool_off")),
                steps.c.state == "processed",
            )
        ).all()
    confirmed = {r.business_key: r for r in waited if r.name == "payment_confirmed"}
    assert set(confirmed) == {f"{prefix}{n:05d}" for n in range(1, ORDERS + 1)} - {
        f"{prefix}{scenario.declined:05d}",
        f"{prefix}{scenario.unconfirmed:05d}",
    }
    assert {r.business_key for r in waited if r.name == "cool_off"} == set(confirmed)
    for key, row in confirmed.items():
        amount = row.input["qty"] * row.input["unit_price"]
        assert row.output == {"order_id": key, "amount": amount, "status": "confirmed"}
    assert states == {"completed": ORDERS - 3, "error": 1, "compensated": 2}
    assert failed.input["order"] == scenario.declined
    # The undeliverable order, and the express order whose payment was never confirmed (its
    # wait timed out).
    assert sorted(r.input["order"] for r in compensated) == sorted(
        [scenario.undeliverable, scenario.unconfirmed]
    )
    assert timed_out in {r.id for r in compensated}
    assert undone == ["charge", "reserve"] * 2  # refund first, then release
    assert alert_runs == [failed.id]
    assert (crashed_ship.state, crashed_ship.failure_count) == ("processed", 1)
