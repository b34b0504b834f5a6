"""Every role runs with the least privileges the deploy recipes grant: the database as the
runtime role of deploy/postgresql/roles.sql (as every integration test does, see conftest), the
broker as a user made by deploy/rabbitmq/least-privilege.sh, limited to the namespace's names
and the default exchange, on a virtual host of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pika
import pika.exceptions
import pytest
from sqlalchemy import Engine, text

from sasflow.transport.topology import Names
from tests import harness, services
from tests.acceptance.processes import REPO, Processes

pytestmark = pytest.mark.acceptance

SCRIPT = REPO / "deploy" / "rabbitmq" / "least-privilege.sh"


@dataclass(frozen=True)
class BrokerUser:
    url: str
    name: str
    vhost: str


@pytest.fixture(scope="module")
def limited_names() -> Names:
    """The namespace the module's broker user is limited to (on its own virtual host, which
    goes with the user)."""
    return Names(services.unique("sftest"))


@pytest.fixture(scope="module")
def limited_broker(limited_names: Names) -> Iterator[BrokerUser]:
    """A user and virtual host made by the shipped script (removed at the module's end: the
    script runs rabbitmqctl several times, a second or more each)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        pytest.skip("rabbitmqctl is needed to create a broker user")
    user, vhost, password = services.unique("sf_app"), services.unique("sf_vhost"), "s3cret"
    try:
        subprocess.run(
            [str(SCRIPT), limited_names.namespace, user, vhost],
            check=True,
            timeout=120,
            env={**os.environ, "SASFLOW_BROKER_PASSWORD": password},
        )
        host = pika.URLParameters(services.broker_url())
        url = f"amqp://{user}:{password}@{host.host}:{host.port}/{quote(vhost, safe='')}"
        yield BrokerUser(url, user, vhost)
    finally:
        subprocess.run([ctl, "-q", "delete_user", user], check=False, timeout=60)
        subprocess.run([ctl, "-q", "delete_vhost", vhost], check=False, timeout=60)


def _heartbeats(broker: BrokerUser) -> list[str]:
    """The heartbeat RabbitMQ negotiated with each connection of the user."""
    ctl = shutil.which("rabbitmqctl")
    assert ctl is not None
    listed = subprocess.run(
        [ctl, "-q", "list_connections", "-p", broker.vhost, "user", "timeout"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    rows = [line.split() for line in listed.stdout.splitlines()]
    return [timeout for user, timeout in rows if user == broker.name]


def _database_connections(engine: Engine, application_name: str) -> int:
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = :name"
    )
    with engine.connect() as conn:
        return int(conn.execute(query, {"name": application_name}).scalar_one())


def test_the_roles_complete_runs_with_a_namespace_limited_broker_user_and_the_runtime_role(
    tmp_path: Path,
    database_url: str,
    engine: Engine,
    limited_names: Names,
    limited_broker: BrokerUser,
) -> None:
    """With non-default connection settings (TLS off), which the processes apply."""
    procs = Processes(tmp_path, database_url=database_url, namespace=limited_names.namespace)
    procs.env.update(
        {
            "SASFLOW_BROKER_URL": limited_broker.url,
            "SASFLOW_BROKER_HEARTBEAT": "7",
            "SASFLOW_DB_POOL_SIZE": "1",
            "SASFLOW_DB_MAX_OVERFLOW": "0",
            "SASFLOW_DB_STATEMENT_TIMEOUT": "20",
        }
    )
    try:
        procs.start("submitter", "submitter")
        procs.start("scheduler", "scheduler")
        procs.start("agent", "agent", "echo")
        procs.start("supervisor", "supervisor", "--interval", "0.5")
        harness.wait_for(
            lambda: "serving namespace" in procs.log("scheduler"), timeout=30, what="scheduler"
        )
        for i in range(3):
            submitted = procs.run(
                "submit", "pipeline", "--input", '{"text": "x"}', "--key", f"k{i}", "--via-broker"
            )
            assert submitted.returncode == 0, submitted.stderr
        harness.wait_for(
            harness.all_runs_in(engine, {"completed"}, 3), timeout=60, what="3 runs completed"
        )
        procs.assert_alive()
        assert _database_connections(engine, "sasflow-scheduler") == 1  # pool 1, no overflow
        assert set(_heartbeats(limited_broker)) == {"7"}
        for name in procs.started:
            log = procs.log(name)
            assert "ACCESS_REFUSED" not in log, (name, log)
            assert "permission denied" not in log, (name, log)
    finally:
        procs.stop_all()


def test_the_limited_broker_user_cannot_declare_outside_its_namespace(
    limited_broker: BrokerUser,
) -> None:
    params = pika.URLParameters(limited_broker.url)
    with contextlib.closing(pika.BlockingConnection(params)) as conn:
        channel = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare(services.unique("other") + ".submit", durable=True)
    assert refused.value.reply_code == 403
