"""A key recorded with another input, on SQLite (the portable path of store.runs.submit): the
result says so (`input_differs`), and `sasflow submit` turns it into a conflict, exit 65."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sasflow import submit_run
from sasflow.cli.main import cli
from sasflow.store import migrate
from sasflow.store.db import make_engine, transaction
from tests.apps import basic


def test_a_duplicate_with_another_input_is_flagged_and_the_recorded_run_kept(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/sasflow.db")
    try:
        migrate.upgrade(engine)
        with transaction(engine) as conn:
            first = submit_run(
                conn, basic.registry, "pipeline", {"text": "a"}, key="k", namespace="t"
            )
            same = submit_run(
                conn, basic.registry, "pipeline", {"text": "a"}, key="k", namespace="t"
            )
            other = submit_run(
                conn, basic.registry, "pipeline", {"text": "b"}, key="k", namespace="t"
            )
    finally:
        engine.dispose()
    assert (first.created, first.input_differs) == (True, False)
    assert (same.run_id, same.created, same.input_differs) == (first.run_id, False, False)
    assert (other.run_id, other.created, other.input_differs) == (first.run_id, False, True)


def test_sasflow_submit_on_sqlite_says_the_conflict(tmp_path: Path) -> None:
    env = {
        "SASFLOW_DATABASE_URL": f"sqlite:///{tmp_path}/sasflow.db",
        "SASFLOW_APP": "tests.apps.basic",
    }
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade"], env=env).exit_code == 0
    args = ["submit", "pipeline", "--key", "k"]
    first = runner.invoke(cli, [*args, "--input", '{"text": "a"}'], env=env)
    assert first.exit_code == 0, first.output
    other = runner.invoke(cli, [*args, "--input", '{"text": "b"}'], env=env)
    assert other.exit_code == 65, other.output
    answer = json.loads(other.stdout)
    assert (answer["created"], answer["conflict"]) == (False, "input differs from the recorded run")
    assert other.stderr.startswith("Error: key 'k' names run 1 of pipeline, recorded with another")
