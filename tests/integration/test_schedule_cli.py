"""`sasflow schedules ...` and `sasflow schedulers ...` on the real database: the operator's
flow, the audit trail, and a clear error (exit 1 or 2) for each kind of bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, select

from sasflow.cli.main import cli
from sasflow.store.schema import audit, runs

pytestmark = pytest.mark.integration


@pytest.fixture
def sasflow(database_url: str) -> Any:
    def invoke(*args: str, exit_code: int = 0) -> Result:
        result = CliRunner().invoke(
            cli,
            list(args),
            env={"SASFLOW_DATABASE_URL": database_url, "SASFLOW_APP": "tests.apps.basic"},
        )
        assert result.exit_code == exit_code, result.output
        return result

    return invoke


def test_schedules_flow(sasflow: Any, engine: Engine) -> None:
    added = json.loads(
        sasflow(
            "schedules",
            "add",
            "poll",
            "--workflow",
            "pipeline",
            "--every",
            "300",
            "--input",
            '{"text": "hi"}',
            "--reason",
            "test",
            "-o",
            "json",
        ).output
    )
    sasflow(
        "schedules",
        "add",
        "nightly",
        "--workflow",
        "pipeline",
        "--cron",
        "0 2 * * *",
        "--timezone",
        "Europe/Paris",
        "--catch-up",
        "skip",
    )
    listed = json.loads(sasflow("schedules", "list", "-o", "json").output)
    assert [s["name"] for s in listed] == ["poll", "nightly"]
    assert "poll" in sasflow("schedules", "list").output

    fired = json.loads(sasflow("schedules", "trigger", "poll", "-o", "json").output)
    shown = json.loads(sasflow("schedules", "show", str(added["id"]), "-o", "json").output)
    assert [t["run_id"] for t in shown["ticks"]] == [fired["run_id"]]
    assert shown["timing"] == "every 300s"
    with engine.connect() as conn:
        key = conn.execute(select(runs.c.business_key)).scalar_one()
    assert key.startswith(f"schedule:{added['id']}:")

    assert "paused" in sasflow("schedules", "pause", "poll").output
    sasflow("schedules", "pause", "poll", exit_code=1)  # paused already
    assert "resumed" in sasflow("schedules", "resume", "poll").output
    sasflow("schedules", "release", "poll", exit_code=1)  # nobody holds it
    assert "removed" in sasflow("schedules", "remove", "nightly").output
    with engine.connect() as conn:
        actions = conn.execute(select(audit.c.action).order_by(audit.c.id)).scalars().all()
    assert actions == [
        "schedules.add",
        "schedules.add",
        "schedules.trigger",
        "schedules.pause",
        "schedules.resume",
        "schedules.remove",
    ]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--workflow", "pipeline", "--cron", "61 * * * *"], 1, "invalid cron"),
        (["--workflow", "pipeline"], 1, "exactly one"),
        (["--workflow", "nope", "--every", "5"], 1, "unknown workflow 'nope'"),
        (["--workflow", "pipeline", "--every", "5", "--timezone", "Nowhere/X"], 1, "time zone"),
        (["--workflow", "pipeline", "--every", "5", "--input", "{"], 2, "--input"),
        (["--workflow", "pipeline", "--every", "0"], 2, "--every"),
    ],
)
def test_schedules_add_refuses_bad_input(
    sasflow: Any, args: list[str], code: int, message: str
) -> None:
    result = sasflow("schedules", "add", "bad", *args, exit_code=code)
    assert message in result.output


def test_unknown_schedule_and_scheduler_are_clear_errors(sasflow: Any) -> None:
    assert (
        "no schedule with id or name 'ghost'"
        in sasflow("schedules", "show", "ghost", exit_code=1).output
    )
    assert (
        "no scheduler named 'ghost'" in sasflow("schedulers", "drain", "ghost", exit_code=1).output
    )
    assert (
        "not on the offline list" in sasflow("schedulers", "undrain", "ghost", exit_code=1).output
    )
    assert json.loads(sasflow("schedulers", "list", "-o", "json").output) == []
