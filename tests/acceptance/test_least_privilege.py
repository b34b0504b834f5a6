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
from pathlib import Path
from urllib.parse import quote

import pika
import pika.exceptions
import pytest
from sqlalchemy import Engine

from sasflow.transport.topology import Names
from tests import harness, services
from tests.acceptance.processes import REPO, Processes

pytestmark = pytest.mark.acceptance

SCRIPT = REPO / "deploy" / "rabbitmq" / "least-privilege.sh"


@pytest.fixture
def limited_broker_url(names: Names) -> Iterator[str]:
    """A user and virtual host made by the shipped script (removed afterwards)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        pytest.skip("rabbitmqctl is needed to create a broker user")
    user, vhost, password = services.unique("sf_app"), services.unique("sf_vhost"), "s3cret"
    try:
        subprocess.run(
            [str(SCRIPT), names.namespace, user, vhost],
            check=True,
            timeout=120,
            env={**os.environ, "SASFLOW_BROKER_PASSWORD": password},
        )
        host = pika.URLParameters(services.broker_url())
        yield f"amqp://{user}:{password}@{host.host}:{host.port}/{quote(vhost, safe='')}"
    finally:
        subprocess.run([ctl, "-q", "delete_user", user], check=False, timeout=60)
        subprocess.run([ctl, "-q", "delete_vhost", vhost], check=False, timeout=60)


def test_the_roles_complete_runs_with_a_namespace_limited_broker_user_and_the_runtime_role(
    tmp_path: Path, database_url: str, engine: Engine, names: Names, limited_broker_url: str
) -> None:
    procs = Processes(tmp_path, database_url=database_url, namespace=names.namespace)
    procs.env["SASFLOW_BROKER_URL"] = limited_broker_url
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
        for name in procs.started:
            log = procs.log(name)
            assert "ACCESS_REFUSED" not in log, (name, log)
            assert "permission denied" not in log, (name, log)
    finally:
        procs.stop_all()


def test_the_limited_broker_user_cannot_declare_outside_its_namespace(
    limited_broker_url: str,
) -> None:
    params = pika.URLParameters(limited_broker_url)
    with contextlib.closing(pika.BlockingConnection(params)) as conn:
        channel = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare(services.unique("other") + ".submit", durable=True)
    assert refused.value.reply_code == 403
