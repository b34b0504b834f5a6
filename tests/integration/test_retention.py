"""History retention: `prune` deletes exactly the finished runs past their retention (never an
active one, nor one with an open alert, nor one another transaction holds), in batches, with an
archive written first and an audit row; the dry run names the same runs; the supervisor
enforces the configured policy; `sasflow db prune` does the same from the command line."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, func, insert, select, text, update

from sasflow import submit_run
from sasflow.cli.main import cli
from sasflow.ops.retention import PruneOptions, RetentionPolicy, prune
from sasflow.states import RunState
from sasflow.store.schema import alerts, audit, events, runs, steps
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests.apps import ops

pytestmark = pytest.mark.integration

POLICY = RetentionPolicy.of(completed_days=30, failed_days=90)


def _run(engine: Engine, names: Names, key: str, state: RunState, days_ago: float | None) -> int:
    """A run of the ops workflow (with its steps and events), moved to `state`, finished
    `days_ago` days ago by the database clock (None: not finished)."""
    with engine.begin() as conn:
        run_id = submit_run(
            conn, ops.registry, "ops", {}, key=key, namespace=names.namespace
        ).run_id
        finished = (
            None
            if days_ago is None
            else func.now() - text(f"interval '{days_ago * 86400} seconds'")
        )
        conn.execute(
            update(runs).where(runs.c.id == run_id).values(state=state, finished_at=finished)
        )
    return run_id


def _alert(engine: Engine, run_id: int, *, acknowledged: bool) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(alerts).values(
                run_id=run_id,
                kind="step_failed",
                dedup_key=f"test:{run_id}",
                message="x",
                acknowledged=acknowledged,
            )
        )


def _ids(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        return set(conn.execute(select(runs.c.id)).scalars())


@pytest.fixture
def history(engine: Engine, names: Names) -> dict[str, int]:
    made = {
        "completed_old": _run(engine, names, "a", RunState.COMPLETED, 40),
        "completed_recent": _run(engine, names, "b", RunState.COMPLETED, 10),
        "error_40d": _run(engine, names, "c", RunState.ERROR, 40),
        "error_old": _run(engine, names, "d", RunState.ERROR, 100),
        "compensated_old": _run(engine, names, "e", RunState.COMPENSATED, 100),
        "running_created_long_ago": _run(engine, names, "f", RunState.RUNNING, None),
        "error_old_open_alert": _run(engine, names, "g", RunState.ERROR, 100),
        "cancelled_old_acknowledged_alert": _run(engine, names, "h", RunState.CANCELLED, 100),
    }
    with engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == made["running_created_long_ago"])
            .values(created_at=func.now() - text("interval '400 days'"))
        )
    _alert(engine, made["error_old_open_alert"], acknowledged=False)
    _alert(engine, made["cancelled_old_acknowledged_alert"], acknowledged=True)
    return made


PRUNED = ("completed_old", "error_old", "compensated_old", "cancelled_old_acknowledged_alert")


def test_prune_deletes_exactly_the_runs_past_retention_in_batches_after_exporting_them(
    engine: Engine, history: dict[str, int], tmp_path: Path
) -> None:
    expected = [history[k] for k in PRUNED]
    preview = prune(engine, POLICY, actor="tester", reason="test", dry_run=True)
    assert sorted(preview.run_ids) == sorted(expected)
    assert _ids(engine) == set(history.values())  # a dry run deletes nothing

    archive = tmp_path / "pruned.jsonl"
    with archive.open("a", encoding="utf-8") as export:
        done = prune(
            engine,
            POLICY,
            actor="tester",
            reason="test",
            options=PruneOptions(batch=1),
            export=export,
        )

    assert sorted(done.run_ids) == sorted(preview.run_ids)
    assert done.batches == len(expected)
    assert _ids(engine) == set(history.values()) - set(expected)
    with engine.connect() as conn:
        for table in (steps, events, alerts):
            left = conn.execute(select(table.c.run_id).where(table.c.run_id.in_(expected)))
            assert list(left) == [], table.name  # cascaded with their runs
        row = conn.execute(select(audit)).one()
    assert (row.actor, row.action, row.reason) == ("tester", "runs.prune", "test")
    assert row.detail["pruned"] == len(expected)
    assert row.detail["batches"] == len(expected)
    lines = [json.loads(line) for line in archive.read_text(encoding="utf-8").splitlines()]
    assert sorted(r["id"] for r in lines) == sorted(expected)
    for line in lines:
        assert line["steps"], "each run is archived with its steps"
        assert line["events"], "and its events"
    acked = next(r for r in lines if r["id"] == history["cancelled_old_acknowledged_alert"])
    assert [a["acknowledged"] for a in acked["alerts"]] == [True]


def test_prune_skips_a_run_another_transaction_holds_instead_of_waiting(
    engine: Engine, history: dict[str, int]
) -> None:
    held = history["completed_old"]
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.begin() as conn:
            conn.execute(select(runs.c.id).where(runs.c.id == held).with_for_update())
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        done = prune(engine, POLICY, actor="tester", reason="test", options=PruneOptions(batch=2))
    finally:
        release.set()
        holder.join()
    assert held not in done.run_ids
    assert held in _ids(engine)
    assert done.pruned == len(PRUNED) - 1
    again = prune(engine, POLICY, actor="tester", reason="test")
    assert again.run_ids == [held]  # the next pass takes it


def test_older_than_with_states_selects_only_those_states(
    engine: Engine, history: dict[str, int]
) -> None:
    policy = RetentionPolicy.older_than(20 * 86400, [RunState.ERROR])
    done = prune(engine, policy, actor="tester", reason="test")
    assert sorted(done.run_ids) == sorted([history["error_40d"], history["error_old"]])


def test_supervisor_sweep_enforces_the_retention_policy(
    engine: Engine, names: Names, history: dict[str, int]
) -> None:
    supervisor = Supervisor(
        engine, names, options=SupervisorOptions(retention=POLICY, prune_batch=2)
    )
    report = supervisor.sweep_once()
    assert report is not None
    assert report.pruned == len(PRUNED)
    assert _ids(engine) == set(history.values()) - {history[k] for k in PRUNED}
    with engine.connect() as conn:
        row = conn.execute(select(audit)).one()
    assert row.actor == supervisor.id
    assert row.detail["pruned"] == len(PRUNED)


def test_db_prune_cli_dry_run_lists_what_yes_then_deletes(
    database_url: str, engine: Engine, names: Names, history: dict[str, int], tmp_path: Path
) -> None:
    env = {
        "SASFLOW_DATABASE_URL": database_url,
        "SASFLOW_NAMESPACE": names.namespace,
        "SASFLOW_RETAIN_COMPLETED_DAYS": "30",
        "SASFLOW_RETAIN_FAILED_DAYS": "90",
    }
    runner = CliRunner()

    def invoke(*args: str) -> Any:
        result = runner.invoke(cli, ["db", "prune", *args, "-o", "json"], env=env)
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    preview = invoke("--dry-run")
    archive = tmp_path / "pruned.jsonl"
    done = invoke("--yes", "--export", str(archive), "--batch", "3", "--reason", "quarterly")
    assert sorted(done["run_ids"]) == sorted(preview["run_ids"])
    assert sorted(done["run_ids"]) == sorted(history[k] for k in PRUNED)
    assert len(archive.read_text(encoding="utf-8").splitlines()) == len(PRUNED)
    assert invoke("--dry-run")["count"] == 0
    by_age = invoke("--dry-run", "--older-than", "5d", "--state", "completed")
    assert by_age["run_ids"] == [history["completed_recent"]]
    refused = runner.invoke(cli, ["db", "prune", "--state", "completed", "--yes"], env=env)
    assert refused.exit_code == 2
    assert "--older-than" in refused.output
