"""A broker list on the real RabbitMQ: with a dead node first in SASFLOW_BROKER_URL, every
role still connects (to the live one) and a run submitted through the CLI completes."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence
from typing import TypeVar

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine

from sasflow.agents.worker import AgentWorker
from sasflow.cli.main import cli
from sasflow.redact import redact_url
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.submitter import Submitter
from sasflow.transport import rabbitmq
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration

T = TypeVar("T")


def _closed_port() -> int:
    """A local port nothing listens on (bound and released: the kernel does not hand it out
    again at once)."""
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def dead_first() -> str:
    """The list: a closed local port first, then the test broker."""
    return f"amqp://guest:guest@127.0.0.1:{_closed_port()}/%2F,{services.broker_url()}"


@pytest.fixture
def in_given_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every connect tries the list as written, so the dead node is tried first each time."""

    def as_given(brokers: Sequence[T], _rng: object) -> list[T]:
        return list(brokers)

    monkeypatch.setattr(rabbitmq, "connect_order", as_given)


@pytest.mark.usefixtures("in_given_order")
def test_roles_skip_a_dead_first_broker_and_a_run_completes(
    engine: Engine, database_url: str, names: Names, dead_first: str
) -> None:
    def transport(role: str) -> RabbitMQTransport:
        return RabbitMQTransport(dead_first, process_name=f"test-{role}")

    submitted = CliRunner().invoke(
        cli,
        [
            *("--broker-url", dead_first, "--namespace", names.namespace),
            *("--app", "tests.apps.basic", "submit", "pipeline", "--via-broker"),
            *("--input", '{"text": "hello"}', "--key", "listed-1"),
        ],
    )
    assert submitted.exit_code == 0, submitted.output
    scheduler = Scheduler(
        engine,
        transport("scheduler"),
        basic.registry,
        names,
        database_url=database_url,
        options=SchedulerOptions(),
    )
    agent = AgentWorker(basic.echo, transport("agent"), names)
    submitter = Submitter(engine, transport("submitter"), basic.registry, names)
    with harness.running(submitter, scheduler, agent):
        harness.wait_for(harness.all_runs_in(engine, {"completed"}, 1), what="run completes")


def test_a_shuffled_list_connects_every_time(dead_first: str) -> None:
    """Whichever order a connect draws, it ends on the live broker (and says which)."""
    transport = RabbitMQTransport(dead_first, process_name="test-list")
    try:
        for _ in range(6):
            transport.connect()
            assert transport.broker == redact_url(services.broker_url())  # password hidden
    finally:
        transport.close()
