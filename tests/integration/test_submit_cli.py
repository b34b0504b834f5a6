"""`sasflow submit`'s key: an empty one is refused, none at all is a random one (a new run each
time), and a key already recorded with another input is a conflict the result says (exit 65)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, func, select

from sasflow.cli.main import cli
from sasflow.store.schema import runs, steps
from sasflow.transport.topology import Names
from tests import services
from tests.apps import basic

pytestmark = pytest.mark.integration

EX_DATAERR = 65


def _submit(database_url: str, names: Names, *args: str) -> Result:
    return CliRunner().invoke(
        cli,
        ["submit", "pipeline", *args],
        env={
            "SASFLOW_DATABASE_URL": database_url,
            "SASFLOW_NAMESPACE": names.namespace,
            "SASFLOW_APP": "tests.apps.basic",
        },
    )


def _runs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(runs)).scalar_one())


@pytest.mark.parametrize("via_broker", [False, True], ids=["database", "broker"])
def test_an_empty_key_is_refused_and_records_nothing(
    database_url: str, names: Names, engine: Engine, via_broker: bool
) -> None:
    extra = ("--via-broker",) if via_broker else ()
    done = _submit(database_url, names, "--input", '{"text": "a"}', "--key", "", *extra)
    assert done.exit_code == 2, done.output
    assert "Error: Invalid value for --key: an empty key names no run" in done.output
    assert done.stdout == ""
    assert _runs(engine) == 0


def test_no_key_is_a_random_one_so_each_call_starts_a_run(
    database_url: str, names: Names, engine: Engine
) -> None:
    first = _submit(database_url, names, "--input", '{"text": "a"}')
    second = _submit(database_url, names, "--input", '{"text": "a"}')
    assert (first.exit_code, second.exit_code) == (0, 0), first.output + second.output
    keys = {json.loads(r.stdout)["key"] for r in (first, second)}
    assert len(keys) == 2
    assert _runs(engine) == 2


def test_the_same_key_and_input_again_is_the_same_run_without_a_conflict(
    database_url: str, names: Names
) -> None:
    first = _submit(database_url, names, "--input", '{"text": "a"}', "--key", "k1")
    again = _submit(database_url, names, "--input", '{"text": "a"}', "--key", "k1")
    assert (first.exit_code, again.exit_code) == (0, 0), again.output
    answer = json.loads(again.stdout)
    assert (answer["run_id"], answer["created"]) == (json.loads(first.stdout)["run_id"], False)
    assert "conflict" not in answer
    assert again.stderr == ""


def test_the_same_key_with_another_input_says_the_conflict_and_exits_65(
    database_url: str, names: Names, engine: Engine
) -> None:
    first = _submit(database_url, names, "--input", '{"text": "a"}', "--key", "k2")
    assert first.exit_code == 0, first.output
    run_id = json.loads(first.stdout)["run_id"]
    other = _submit(database_url, names, "--input", '{"text": "b"}', "--key", "k2")
    assert other.exit_code == EX_DATAERR, other.output
    assert json.loads(other.stdout) == {
        "run_id": run_id,
        "workflow": "pipeline",
        "key": "k2",
        "created": False,
        "state": "pending",
        "conflict": "input differs from the recorded run",
    }
    assert other.stderr == (
        f"Error: key 'k2' names run {run_id} of pipeline, recorded with another input: that "
        "run is kept as it is and this input was not used (submit it with another key)\n"
    )
    with engine.connect() as conn:
        kept = conn.execute(select(runs.c.input).where(runs.c.id == run_id)).scalar_one()
    assert kept == {"text": "a"}
    assert _runs(engine) == 1


KNOWN = ", ".join(sorted({w.name for w in basic.registry.workflows}))


@pytest.mark.parametrize("via_broker", [False, True], ids=["database", "broker"])
def test_an_unknown_workflow_is_refused_with_the_known_names_and_nothing_is_published(
    database_url: str, names: Names, engine: Engine, via_broker: bool
) -> None:
    extra = ("--via-broker",) if via_broker else ()
    env = {
        "SASFLOW_DATABASE_URL": database_url,
        "SASFLOW_NAMESPACE": names.namespace,
        "SASFLOW_APP": "tests.apps.basic",
        "SASFLOW_BROKER_URL": services.broker_url(),
    }

    unknown = CliRunner().invoke(cli, ["submit", "pipelin", *extra], env=env)
    version = CliRunner().invoke(cli, ["submit", "pipeline", "--version", "9", *extra], env=env)

    assert unknown.exit_code == 1, unknown.output
    assert unknown.stderr == (f"Error: unknown workflow 'pipelin'; known workflows: {KNOWN}\n")
    assert version.exit_code == 1, version.output
    assert version.stderr == (
        "Error: unknown workflow 'pipeline' version 9; registered versions of 'pipeline': 1\n"
    )
    assert unknown.stdout == version.stdout == ""
    assert _runs(engine) == 0
    assert not services.queue_exists(names.submit), "nothing was published, nothing declared"


def test_via_broker_a_known_workflow_is_published(database_url: str, names: Names) -> None:
    env = {
        "SASFLOW_NAMESPACE": names.namespace,
        "SASFLOW_APP": "tests.apps.basic",
        "SASFLOW_BROKER_URL": services.broker_url(),
    }

    done = CliRunner().invoke(
        cli, ["submit", "pipeline", "--version", "1", "--key", "k1", "--via-broker"], env=env
    )

    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"published": True, "workflow": "pipeline", "key": "k1"}
    with services.broker_channel() as channel:
        assert channel.queue_declare(names.submit, passive=True).method.message_count == 1


def test_start_at_delays_the_first_step_and_needs_an_offset(
    database_url: str, names: Names, engine: Engine
) -> None:
    start_at = "2030-01-01T09:00:00+00:00"
    naive = _submit(database_url, names, "--input", '{"text": "a"}', "--start-at", "2030-01-01")
    assert naive.exit_code == 2, naive.output
    assert "start_at" in naive.output
    done = _submit(database_url, names, "--input", '{"text": "a"}', "--start-at", start_at)
    assert done.exit_code == 0, done.output
    run_id = json.loads(done.stdout)["run_id"]
    with engine.connect() as conn:
        first = conn.execute(
            select(steps.c.not_before).where(steps.c.run_id == run_id, steps.c.name == "a")
        ).scalar_one()
    assert first == datetime.fromisoformat(start_at)
