"""A submission pydantic refuses is said in one line, each field as `field: message` (the
shared `problems_line`), never pydantic's multi-line dump (input values, documentation links):
from `submit_run` (the SDK), `sasflow submit` and the HTTP API's service (`ops.submit`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sasflow import submit_run
from sasflow.cli.main import cli
from sasflow.commands import NewRun
from sasflow.errors import InvalidInputError
from sasflow.messages import DEFAULT_LIMITS
from sasflow.ops import submit as ops_submit
from sasflow.store import migrate
from sasflow.store.db import make_engine, transaction
from tests.apps import basic

PROBLEMS = (
    "input: Value error, the run input must be a JSON object, got list; "
    "priority: Input should be less than or equal to 1000"
)


def test_submit_run_says_each_field_in_one_line(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/sasflow.db")
    try:
        migrate.upgrade(engine)
        with transaction(engine) as conn, pytest.raises(InvalidInputError) as refused:
            submit_run(conn, basic.registry, "pipeline", [1], priority=5000, namespace="t")
    finally:
        engine.dispose()
    assert str(refused.value) == f"invalid submission: {PROBLEMS}"


def test_the_apis_submission_service_says_each_field_in_one_line(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/sasflow.db")
    new = NewRun(workflow="pipeline", input=[1], priority=5000)
    try:
        migrate.upgrade(engine)
        with transaction(engine) as conn, pytest.raises(InvalidInputError) as refused:
            ops_submit.submit_run(
                conn, basic.registry, new, actor="t", namespace="t", limits=DEFAULT_LIMITS
            )
    finally:
        engine.dispose()
    assert str(refused.value) == f"invalid submission: {PROBLEMS}"


def test_sasflow_submit_says_each_field_in_one_line(tmp_path: Path) -> None:
    env = {
        "SASFLOW_DATABASE_URL": f"sqlite:///{tmp_path}/sasflow.db",
        "SASFLOW_APP": "tests.apps.basic",
    }
    args = ["submit", "pipeline", "--input", "[1]", "--key", "k" * 201]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == (
        "Error: invalid submission: input: Value error, the run input must be a JSON object, "
        "got list; key: String should have at most 200 characters"
    )
    assert "errors.pydantic.dev" not in result.stderr
