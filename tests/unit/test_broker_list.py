"""SASFLOW_BROKER_URL as a list of RabbitMQ nodes: how it is cut and checked, the order each
connect tries it in, and its passwords hidden wherever it is shown."""

from __future__ import annotations

import random
import ssl
from collections.abc import Sequence
from typing import Any

import pika
import pika.exceptions
import pytest
from click.testing import CliRunner

from sasflow.cli.context import EX_CONFIG
from sasflow.cli.main import cli
from sasflow.errors import BrokerUnavailableError, ConfigurationError
from sasflow.redact import redact_url
from sasflow.settings import Settings
from sasflow.transport.brokers import broker_urls, connect_order
from sasflow.transport.connection import BrokerOptions, broker_parameters
from sasflow.transport.factory import is_in_process, make_transport
from sasflow.transport.rabbitmq import RabbitMQTransport

ONE = "amqp://app:s3cret@mq1.example:5672/%2F"
TWO = "amqp://app:s3cret@mq2.example:5673/%2F"


def test_one_url_is_a_list_of_one() -> None:
    assert broker_urls(ONE) == (ONE,)


def test_urls_are_separated_by_commas_with_optional_whitespace() -> None:
    """Spaces, tabs and newlines around a comma, and around the whole list, are ignored."""
    assert broker_urls(f"  {ONE} ,\n\t{TWO}\n") == (ONE, TWO)


@pytest.mark.parametrize("password", ["p,w", "p@w", "p@,w", "a,amqp:b"])
def test_a_comma_or_at_sign_in_a_password_stays_in_its_url(password: str) -> None:
    """Only a comma followed by the next URL's scheme separates, so passwords need no escaping."""
    first = f"amqp://app:{password}@mq1.example/%2F"

    assert broker_urls(f"{first},{TWO}") == (first, TWO)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f",{ONE}", "broker URL 1 of 2 ('') is empty"),
        (f"{ONE},", "broker URL 'amqp://app:***@mq1.example:5672/%2F,' holds a comma"),
        (f"{ONE},,{TWO}", "broker URL 1 of 2 ('amqp://app:***@mq1.example:5672/%2F,') holds a"),
        ("amqp://app:s3cret@mq1,mq2/", "broker URL 'amqp://app:***@mq1,mq2/' holds a comma"),
        (f"{ONE},amqp://mq 2/", "broker URL 2 of 2 ('amqp://mq 2/') holds whitespace"),
        (f"{ONE},redis://app:s3cret@r/", "unsupported broker URL 2 of 2 ('redis://app:***@r/')"),
        (f"memory://,{ONE}", "broker URL 1 of 2 ('memory://') is the in-process bus"),
        ("", "broker URL '' is empty"),
    ],
)
def test_a_bad_entry_is_named_in_one_line_without_its_password(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        broker_urls(text)

    error = str(raised.value)
    assert error.startswith(message), error
    assert "\n" not in error
    assert "s3cret" not in error


def test_an_entry_pika_refuses_is_named_by_its_position() -> None:
    with pytest.raises(ConfigurationError) as raised:
        broker_parameters(f"{ONE},amqp://app:s3cret@mq2:port/", BrokerOptions())

    assert str(raised.value).startswith("broker URL 2 of 2: invalid broker URL 'amqp://app:***@")
    assert "s3cret" not in str(raised.value)


def test_the_options_apply_to_every_url_of_the_list() -> None:
    options = BrokerOptions(heartbeat=7, connection_attempts=3, retry_delay=0.5, socket_timeout=4)

    params = broker_parameters(f"{ONE}, amqps://app:s3cret@mq2.example/%2F", options)

    assert [(p.host, p.port) for p in params] == [("mq1.example", 5672), ("mq2.example", 5671)]
    assert [
        (p.heartbeat, p.connection_attempts, p.retry_delay, p.socket_timeout) for p in params
    ] == [(7, 3, 0.5, 4)] * 2
    tls = params[1].ssl_options
    assert tls is not None
    assert tls.context.verify_mode == ssl.CERT_REQUIRED


def test_tls_files_need_every_url_of_the_list_to_be_amqps() -> None:
    amqps = "amqps://mq1.example/%2F"

    with pytest.raises(ConfigurationError, match=r"^broker URL 1 of 2: .*'amqp://mq2[^ ]* is not"):
        broker_parameters(f"amqp://mq2.example/%2F,{amqps}", BrokerOptions(ca_file="/etc/ca.pem"))


def test_the_in_process_bus_is_only_a_list_of_one() -> None:
    assert is_in_process("memory://")
    assert not is_in_process(f"memory://,{ONE}")
    with pytest.raises(ConfigurationError, match="cannot be one of several brokers"):
        make_transport(f"memory://,{ONE}", process_name="t")


def test_connect_order_is_a_new_permutation_each_time() -> None:
    brokers = ("a", "b", "c")
    rng = random.Random(1)  # noqa: S311 - a seeded order, not a secret

    orders = {tuple(connect_order(brokers, rng)) for _ in range(200)}

    assert all(sorted(order) == ["a", "b", "c"] for order in orders)
    assert len(orders) == 6
    assert brokers == ("a", "b", "c")


def test_every_connect_hands_pika_the_whole_list_in_a_new_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pika tries a sequence of parameters in order: each connect gives it a shuffled one, and
    a failure names the list it tried, passwords hidden."""
    tried: list[list[str | None]] = []

    def refuse(configs: Sequence[pika.URLParameters]) -> Any:
        tried.append([c.host for c in configs])
        raise pika.exceptions.AMQPConnectionError("no broker")

    monkeypatch.setattr(pika, "BlockingConnection", refuse)
    transport = RabbitMQTransport(f"{ONE},{TWO}", process_name="t")
    messages = []
    for _ in range(40):
        with pytest.raises(BrokerUnavailableError) as raised:
            transport.connect()
        messages.append(str(raised.value))

    assert {tuple(order) for order in tried} == {
        ("mq1.example", "mq2.example"),
        ("mq2.example", "mq1.example"),
    }
    assert messages[0].endswith(
        "(tried amqp://app:***@mq1.example:5672/%2F,amqp://app:***@mq2.example:5673/%2F)"
    )
    assert not any("s3cret" in m for m in messages)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"{ONE},{TWO}", "amqp://app:***@mq1.example:5672/%2F,amqp://app:***@mq2.example:5673/%2F"),
        (
            "amqp://u:p@ss@mq1/, amqps://u:x,y@mq2/",
            "amqp://u:***@mq1/, amqps://u:***@mq2/",
        ),
        ("amqp://mq1/,amqp://u:pw@mq2/", "amqp://mq1/,amqp://u:***@mq2/"),
        (
            "postgresql://u:pw@db1,db2/flows?target_session_attrs=read-write",
            "postgresql://u:***@db1,db2/flows?target_session_attrs=read-write",
        ),
    ],
)
def test_redact_url_hides_each_password_of_a_list(text: str, expected: str) -> None:
    """Each URL keeps its host; a password holding '@' or ',' is hidden whole; a multi-host
    database URL is one URL."""
    assert redact_url(text) == expected


def test_settings_and_config_show_hide_every_password_of_the_list() -> None:
    shown = Settings(broker_url=f"{ONE},{TWO}").redacted()["broker_url"]

    assert shown == "amqp://app:***@mq1.example:5672/%2F,amqp://app:***@mq2.example:5673/%2F"
    result = CliRunner().invoke(
        cli, ["--broker-url", "amqp://u:p@w@mq1/, amqp://u:pw@mq2/", "config", "show", "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    assert '"broker_url": "amqp://u:***@mq1/, amqp://u:***@mq2/"' in result.output


@pytest.mark.parametrize("role", [["submitter"], ["scheduler"], ["agent", "echo"]])
def test_a_bad_entry_ends_a_role_with_ex_config_before_any_connection(role: list[str]) -> None:
    result = CliRunner().invoke(
        cli,
        ["--broker-url", f"{ONE},amqp://u:s3cret@mq2,mq3/", "--app", "tests.apps.basic", *role],
    )

    assert result.exit_code == EX_CONFIG, result.output
    assert "broker URL 2 of 2 ('amqp://u:***@mq2,mq3/') holds a comma" in result.output
    assert "s3cret" not in result.output


def test_a_bad_entry_fails_an_operator_command_with_status_1() -> None:
    result = CliRunner().invoke(
        cli,
        [
            *("--broker-url", f"{ONE},,{TWO}", "--app", "tests.apps.basic"),
            *("submit", "pipeline", "--via-broker"),
        ],
    )

    assert result.exit_code == 1, result.output
    assert "broker URL 1 of 2" in result.output
