"""CLI errors when a service cannot be reached: clear, without the URL's password, and without
the broker client's log lines (one-shot commands; the roles keep theirs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from sasflow.cli.main import cli
from sasflow.transport.topology import Names
from tests import services

pytestmark = pytest.mark.integration

DOWN = "amqp://svc:s3cret@127.0.0.1:1/%2F"


def test_broker_password_never_reaches_the_output() -> None:
    """An unreachable broker is a clear error that does not print the URL's password."""
    result = CliRunner().invoke(
        cli,
        ["submit", "order", "--via-broker"],
        env={"SASFLOW_BROKER_URL": "amqp://svc:s3cret@127.0.0.1:1/%2F"},
    )
    assert result.exit_code == 1
    assert "broker unavailable" in result.output
    assert "s3cret" not in result.output


def _sasflow(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`sasflow` as an operator runs it: its own process, its own logging set up."""
    variables = {k: v for k, v in os.environ.items() if not k.startswith("SASFLOW_")}
    return subprocess.run(
        [sys.executable, "-m", "sasflow", *args],
        env={**variables, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_a_one_shot_command_prints_no_broker_log_line_unless_verbose(names: Names) -> None:
    """`submit --via-broker` connects, publishes and says so on stdout: stderr stays empty (no
    `connected to broker`); with -v the broker's lines are there. An unreachable broker is the
    command's one error line, no pika traceback."""
    env = {
        "SASFLOW_BROKER_URL": services.broker_url(),
        "SASFLOW_NAMESPACE": names.namespace,
        "SASFLOW_APP": "tests.apps.basic",
    }
    quiet = _sasflow("submit", "pipeline", "--key", "k1", "--via-broker", **env)
    verbose = _sasflow("-v", "submit", "pipeline", "--key", "k2", "--via-broker", **env)
    down = _sasflow("submit", "pipeline", "--via-broker", **{**env, "SASFLOW_BROKER_URL": DOWN})

    assert (quiet.returncode, quiet.stderr) == (0, ""), quiet.stderr
    assert '"published": true' in quiet.stdout
    assert verbose.returncode == 0, verbose.stderr
    assert "sasflow.transport.rabbitmq: connected to broker" in verbose.stderr
    assert down.returncode == 1
    (line,) = down.stderr.splitlines()
    assert line.startswith("Error: broker unavailable: ")


def test_a_long_running_role_keeps_its_broker_log_lines(names: Names, database_url: str) -> None:
    """The submitter (a role) logs its connection, as before; stopped by SIGTERM."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SASFLOW_")},
        "SASFLOW_BROKER_URL": services.broker_url(),
        "SASFLOW_NAMESPACE": names.namespace,
        "SASFLOW_APP": "tests.apps.basic",
        "SASFLOW_DATABASE_URL": database_url,
    }
    seen: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-m", "sasflow", "submitter"], env=env, stderr=subprocess.PIPE, text=True
    ) as role:
        try:
            assert role.stderr is not None
            for line in role.stderr:
                seen.append(line)
                if "connected to broker" in line:
                    break
        finally:
            role.send_signal(signal.SIGTERM)
            role.wait(timeout=60)
    assert "sasflow.transport.rabbitmq: connected to broker" in seen[-1], seen
