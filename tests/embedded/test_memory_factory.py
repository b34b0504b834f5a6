"""Choosing the transport by URL, and the CLI refusing the in-process bus where it cannot work."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sasflow.cli.context import CliContext
from sasflow.cli.main import cli
from sasflow.errors import BrokerUnavailableError, ConfigurationError
from sasflow.settings import Settings
from sasflow.transport.factory import is_in_process, make_transport
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.rabbitmq import RabbitMQTransport

APP = "tests.apps.basic"


@pytest.mark.parametrize(
    "url", ["amqp://localhost:5672/%2F", "amqps://u:p@localhost/vh", "AMQP://localhost"]
)
def test_amqp_urls_make_a_rabbitmq_transport(url: str) -> None:
    assert isinstance(make_transport(url, process_name="t"), RabbitMQTransport)
    assert is_in_process(url) is False


@pytest.mark.parametrize("url", ["memory://", "memory://demo", "MEMORY://"])
def test_memory_urls_make_a_transport_on_the_given_broker(url: str) -> None:
    broker = MemoryBroker()
    first = make_transport(url, process_name="a", broker=broker)
    second = make_transport(url, process_name="b", broker=broker)
    assert isinstance(first, MemoryTransport)
    assert is_in_process(url) is True
    first.connect()
    second.connect()
    first.declare_queue("q", dead_letter_exchange=None)
    assert second.get("q") is None  # declared by the other one: they share the broker


def test_memory_url_without_a_broker_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="no MemoryBroker was given"):
        make_transport("memory://", process_name="t")


@pytest.mark.parametrize("url", ["redis://localhost", "localhost:5672", "", "http://x"])
def test_unknown_scheme_names_the_accepted_ones(url: str) -> None:
    with pytest.raises(ConfigurationError, match=r"amqp://, amqps:// .* or memory://"):
        make_transport(url, process_name="t")
    assert is_in_process(url) is False


def test_unknown_scheme_does_not_leak_the_password() -> None:
    with pytest.raises(ConfigurationError) as caught:
        make_transport("redis://user:hunter2@localhost", process_name="t")
    assert "hunter2" not in str(caught.value)


def test_in_process_context_shares_one_lazily_created_broker() -> None:
    context = CliContext(Settings(broker_url="memory://"), in_process=True)
    scheduler, agent = context.transport("scheduler"), context.transport("agent-echo")
    scheduler.connect()
    agent.connect()
    scheduler.declare_queue("q", dead_letter_exchange=None)
    agent.declare_queue("q", dead_letter_exchange=None)
    with pytest.raises(BrokerUnavailableError, match="PRECONDITION_FAILED"):
        agent.declare_queue("q", dead_letter_exchange="x")  # same broker: a real conflict


@pytest.mark.parametrize(
    "command",
    [
        ["submitter"],
        ["scheduler"],
        ["agent", "echo"],
        ["supervisor", "--once"],
        ["submit", "pipeline", "--input", "{}", "--via-broker"],
    ],
)
def test_separate_process_roles_refuse_the_in_process_bus(command: list[str]) -> None:
    result = CliRunner().invoke(cli, ["--broker-url", "memory://", "--app", APP, *command])
    assert result.exit_code == 2, result.output
    assert "only connects roles running inside one process" in result.output
    assert "--broker-url amqp://" in result.output
    assert "sasflow demo" in result.output


def test_cli_reports_an_unsupported_broker_scheme() -> None:
    result = CliRunner().invoke(
        cli,
        ["--broker-url", "redis://localhost", "--app", APP, "submit", "pipeline", "--via-broker"],
    )
    assert result.exit_code == 1, result.output
    assert "unsupported broker URL 'redis://localhost'" in result.output
