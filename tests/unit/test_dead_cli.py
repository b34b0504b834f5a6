"""`sasflow dead` on the in-process bus: refused with a message naming RabbitMQ."""

from __future__ import annotations

from click.testing import CliRunner

from sasflow.cli.main import cli


def test_dead_commands_refuse_the_in_process_bus_with_a_clear_message() -> None:
    result = CliRunner().invoke(
        cli, ["dead", "list"], env={"SASFLOW_BROKER_URL": "memory://", "SASFLOW_APP": ""}
    )
    assert result.exit_code == 2
    assert "sasflow dead needs RabbitMQ" in result.output
