"""Operator commands: list, show, resubmit (failed step, earlier step, corrected input, bulk
dry-run then real), cancel; every action recorded with who and why."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, select

from sasflow import submit_run
from sasflow.cli.main import cli
from sasflow.store.schema import alerts, events
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import ops

pytestmark = pytest.mark.integration

Sasflow = Callable[..., Result]


@pytest.fixture
def sasflow(database_url: str, names: Names) -> Sasflow:
    return harness.cli(database_url, names, "tests.apps.ops", expect=0)


@pytest.fixture
def system(engine: Engine, database_url: str, names: Names) -> Iterator[None]:
    with harness.running(
        harness.scheduler(engine, database_url, ops.registry, names, rescan_interval=0.1),
        harness.agent(ops.remote, names),
    ):
        yield


def _submit(engine: Engine, names: Names, key: str, **run_input: Any) -> int:
    with engine.begin() as conn:
        return submit_run(
            conn, ops.registry, "ops", run_input, key=key, namespace=names.namespace
        ).run_id


def _state(engine: Engine, run_id: int) -> str:
    return harness.run_states(engine)[run_id]


def _wait_state(engine: Engine, run_id: int, state: str) -> None:
    harness.wait_for(lambda: _state(engine, run_id) == state, what=f"run {run_id} {state}")


def _json(result: Result) -> Any:
    return json.loads(result.output)


@pytest.mark.parametrize("form", ["text", "@file", "path"])
def test_resubmit_from_the_failed_step_with_a_corrected_input(  # noqa: PLR0917 - fixtures
    engine: Engine, names: Names, sasflow: Sasflow, system: None, tmp_path: Path, form: str
) -> None:
    """Step b fails permanently on a bad input; the operator corrects the input (JSON text, as
    `submit --input` takes it, @FILE, or a file's path as before) and resubmits: only b runs
    again (with a fresh idempotency key), failure counts are reset, the alert is closed, and
    who/why are in the timeline."""
    run_id = _submit(engine, names, "bad", value=7, fail=True)
    _wait_state(engine, run_id, "error")
    before = {r.name: r for r in harness.step_rows(engine, run_id)}
    listed = _json(sasflow("runs", "list", "--state", "error", "-o", "json"))
    assert [r["id"] for r in listed] == [run_id]
    fixed = tmp_path / "input.json"
    fixed.write_text(json.dumps({"value": 7}))
    given = {"text": '{"value": 7}', "@file": f"@{fixed}", "path": str(fixed)}[form]
    done = _json(
        sasflow(
            "runs",
            "resubmit",
            str(run_id),
            "--reason",
            "bad flag removed",
            "--input",
            given,
            "--by",
            "ops@example",
            "-o",
            "json",
        )
    )
    assert done == {"run_id": run_id, "reset": ["b"], "ready": ["b"]}
    _wait_state(engine, run_id, "completed")
    after = {r.name: r for r in harness.step_rows(engine, run_id)}
    assert after["a"].attempt == before["a"].attempt == 1  # a was not run again
    assert after["b"].attempt == 2
    assert after["b"].idempotency_key != before["b"].idempotency_key
    assert after["b"].input == {"value": 7}
    shown = _json(sasflow("runs", "show", str(run_id), "-o", "json"))
    resubmitted = [e for e in shown["events"] if e["reason"] == "resubmitted: bad flag removed"]
    assert resubmitted[0]["actor"] == "ops@example"
    assert resubmitted[0]["detail"]["previous_input"] == {"value": 7, "fail": True}
    (failure,) = shown["failures"]
    assert (failure["step"], failure["attempt"], failure["outcome"]) == ("b", 1, "error")
    assert failure["error"]["message"] == "remote refused b", "why it failed outlives the fix"
    human = sasflow("runs", "show", str(run_id)).output
    assert "PermanentError: remote refused b" in human
    with engine.connect() as conn:
        open_alerts = conn.execute(
            select(alerts.c.id).where(alerts.c.acknowledged.is_(False))
        ).all()
    assert open_alerts == []


def test_resubmit_from_an_earlier_step_runs_it_and_everything_after_again(
    engine: Engine, names: Names, sasflow: Sasflow, system: None
) -> None:
    run_id = _submit(engine, names, "fine", value=1)
    _wait_state(engine, run_id, "completed")
    sasflow("runs", "resubmit", str(run_id), "--reason", "remote lost the data", "--from-step", "a")
    harness.wait_for(
        lambda: {r.attempt for r in harness.step_rows(engine, run_id)} == {2},
        what="both steps ran again",
    )
    _wait_state(engine, run_id, "completed")


def test_bulk_dry_run_lists_exactly_what_the_real_resubmission_then_resubmits(
    engine: Engine, names: Names, sasflow: Sasflow, system: None
) -> None:
    failed = [_submit(engine, names, f"f{i}", value=i, fail=True) for i in range(3)]
    fine = _submit(engine, names, "ok", value=9)
    for run_id in failed:
        _wait_state(engine, run_id, "error")
    _wait_state(engine, fine, "completed")
    preview = _json(
        sasflow(
            "runs",
            "resubmit",
            "--state",
            "error",
            "--workflow",
            "ops",
            "--reason",
            "retry all",
            "--dry-run",
            "-o",
            "json",
        )
    )
    assert preview == {"dry_run": True, "count": 3, "run_ids": failed}
    assert {r: _state(engine, r) for r in failed} == dict.fromkeys(failed, "error")
    done = _json(
        sasflow(
            "runs",
            "resubmit",
            "--state",
            "error",
            "--workflow",
            "ops",
            "--reason",
            "retry all",
            "--yes",
            "-o",
            "json",
        )
    )
    assert done["run_ids"] == preview["run_ids"]
    with engine.connect() as conn:
        acted = set(
            conn.execute(
                select(events.c.run_id).where(
                    events.c.reason == "resubmitted: retry all", events.c.entity == "run"
                )
            ).scalars()
        )
    assert acted == set(failed)


def test_bulk_resubmission_without_dry_run_or_yes_is_refused(
    database_url: str, names: Names
) -> None:
    result = CliRunner().invoke(
        cli,
        ["runs", "resubmit", "--reason", "x"],
        env={"SASFLOW_DATABASE_URL": database_url, "SASFLOW_APP": "tests.apps.ops"},
    )
    assert result.exit_code == 2
    assert "--dry-run or --yes" in result.output


def test_cancel_stops_a_running_run_and_its_late_reply_is_ignored(
    engine: Engine, names: Names, sasflow: Sasflow, system: None
) -> None:
    run_id = _submit(engine, names, "slow", value=1, delay=1.5)
    harness.wait_for(
        lambda: any(r.state == "processing" for r in harness.step_rows(engine, run_id)),
        what="step a in flight",
    )
    done = _json(
        sasflow("runs", "cancel", str(run_id), "--reason", "customer withdrew", "-o", "json")
    )
    assert done == {"run_id": run_id, "state": "cancelled", "cancelled_steps": ["a", "b"]}
    time.sleep(2.0)  # the agent finishes a and replies: the reply must be dropped
    states = {r.name: r.state for r in harness.step_rows(engine, run_id)}
    assert states == {"a": "cancelled", "b": "cancelled"}
    assert _state(engine, run_id) == "cancelled"
    shown = _json(sasflow("runs", "show", str(run_id), "-o", "json"))
    assert shown["run"]["error"]["message"] == "customer withdrew"
