"""The command line without services: help, settings precedence, redaction, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sasflow.cli.main import COMMANDS, cli
from tests.unit.expected import (
    ALERT_DEFAULTS,
    API_DEFAULTS,
    CONNECTION_DEFAULTS,
    LIMIT_DEFAULTS,
    RETENTION_DEFAULTS,
    STREAM_DEFAULTS,
)


@pytest.mark.parametrize("command", [[], ["scheduler"], ["agent"], ["submitter"]])
def test_every_option_shows_its_environment_variable_in_help(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0, result.output
    text = "".join(result.output.split())  # help text wraps long variable lists
    expected = {
        (): [
            "SASFLOW_DATABASE_URL",
            "SASFLOW_BROKER_URL",
            "SASFLOW_NAMESPACE",
            "SASFLOW_APP",
            "SASFLOW_LOG_LEVEL",
        ],
        ("scheduler",): [
            "SASFLOW_SCHEDULER_BATCH",
            "SASFLOW_SCHEDULER_REPLY_PREFETCH",
            "SASFLOW_SCHEDULER_MAX_IN_FLIGHT",
            "SASFLOW_SCHEDULER_RESCAN_INTERVAL",
        ],
        ("agent",): [
            "SASFLOW_AGENT_CONCURRENCY",
            "SASFLOW_AGENT_DRAIN_TIMEOUT",
            "SASFLOW_AGENT_STATE_DIR",
            "SASFLOW_AGENT_HEARTBEAT_INTERVAL",
        ],
        ("submitter",): ["SASFLOW_SUBMITTER_PREFETCH", "SASFLOW_SUBMITTER_ON_BACKLOG"],
    }[tuple(command)]
    missing = [
        variable
        for variable in expected
        if f"envvar:{variable}" not in text and f",{variable}" not in text
    ]
    assert missing == []


def test_config_show_redacts_passwords_and_prefers_options_over_variables() -> None:
    env = {
        "SASFLOW_DATABASE_URL": "postgresql+psycopg://app:hunter2@db.internal:5432/flows",
        "SASFLOW_BROKER_URL": "amqp://svc:pa/ss@mq:5672/%2F",
        "SASFLOW_NAMESPACE": "from-env",
    }
    result = CliRunner().invoke(
        cli, ["--namespace", "from-option", "config", "show", "-o", "json"], env=env
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown == {
        "database_url": "postgresql+psycopg://app:***@db.internal:5432/flows",
        "broker_url": "amqp://svc:***@mq:5672/%2F",
        "namespace": "from-option",
        "app": None,
        **ALERT_DEFAULTS,
        **LIMIT_DEFAULTS,
        **RETENTION_DEFAULTS,
        **STREAM_DEFAULTS,
        **CONNECTION_DEFAULTS,
        **API_DEFAULTS,
    }
    table = CliRunner().invoke(cli, ["config", "show"], env=env)
    assert "hunter2" not in table.output
    assert "pa/ss" not in table.output


def test_invalid_namespace_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["--namespace", "bad name!", "config", "show"])
    assert result.exit_code == 2
    assert "namespace" in result.output


def test_submit_rejects_non_json_input_and_missing_app() -> None:
    bad = CliRunner().invoke(cli, ["submit", "order", "--input", "{nope"])
    assert bad.exit_code == 2
    assert "the input is not UTF-8 JSON" in bad.output
    no_app = CliRunner().invoke(cli, ["submit", "order", "--input", "{}"], env={"SASFLOW_APP": ""})
    assert no_app.exit_code == 1
    assert "--app" in no_app.output


def test_config_show_table_prints_lists_and_booleans_as_variables_take_them() -> None:
    result = CliRunner().invoke(
        cli,
        ["config", "show"],
        env={
            "SASFLOW_ALERT_EMAIL_TO": "ops@example.com,dev@example.com",
            "SASFLOW_ALERT_EXCHANGE": "false",
        },
    )
    assert result.exit_code == 0, result.output
    assert "ops@example.com,dev@" in result.output  # folded, but comma-separated
    assert "['" not in result.output
    assert "│ false " in result.output
    assert "…" not in result.output


def test_every_subcommand_is_found_under_its_own_name() -> None:
    """cli/main.py names each lazily loaded command; a wrong path or name fails here."""
    with click.Context(cli) as ctx:
        names = cli.list_commands(ctx)
        loaded = {name: cli.get_command(ctx, name) for name in names}
    assert names == sorted(COMMANDS)
    assert {name: command.name if command else None for name, command in loaded.items()} == {
        name: name for name in names
    }


def test_a_role_does_not_import_the_other_commands_modules() -> None:
    """`sasflow agent` starts without Alembic, the demo's display or the operator commands."""
    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from sasflow.cli.main import cli\n"
        "result = CliRunner().invoke(cli, ['agent', '--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(sorted(m for m in ('alembic', 'sasflow.cli.db', 'sasflow.cli.demo', "
        "'sasflow.cli.runs', 'sasflow.cli.alerts', 'rich.live') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("args", [["agent"], ["agent", "payments", "--builtin", "command"]])
def test_agent_wants_a_name_or_builtin_not_both_or_neither(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "give an agent NAME or --builtin, not both or neither" in result.output


def test_an_unknown_agent_name_lists_the_app_s_agents() -> None:
    result = CliRunner().invoke(cli, ["--app", "tests.apps.basic", "agent", "ecoh"])
    assert result.exit_code == 1, result.output
    assert result.stderr == "Error: unknown agent 'ecoh' (known agents: echo)\n"


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("[1]", "'[1]' is neither a JSON object nor @FILE naming a file"),
        ('{"a": ', "Invalid value for --input: the input"),
        ("@/nonexistent/input.json", "neither a JSON object nor @FILE naming a file"),
        ("[1]@", "neither a JSON object nor @FILE"),
    ],
)
def test_resubmit_input_is_json_text_or_a_file_and_bad_input_is_a_usage_error(
    given: str, said: str
) -> None:
    result = CliRunner().invoke(
        cli, ["--app", "tests.apps.ops", "runs", "resubmit", "1", "--reason", "r", "--input", given]
    )
    assert result.exit_code == 2, result.output
    assert said in result.stderr


def test_resubmit_input_from_a_file_must_be_an_object(tmp_path: Path) -> None:
    listed = tmp_path / "input.json"
    listed.write_text("[1]")
    result = CliRunner().invoke(
        cli,
        [
            *("--app", "tests.apps.ops", "runs", "resubmit", "1", "--reason", "r"),
            "--input",
            f"@{listed}",
        ],
    )
    assert result.exit_code == 2, result.output
    assert f"{listed}: the run input must be a JSON object, got list" in result.stderr
