"""CLI errors when a service cannot be reached: clear, and without the URL's password."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sasflow.cli.main import cli

pytestmark = pytest.mark.integration


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
