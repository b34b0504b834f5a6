"""A permanent misconfiguration at start-up (no such database, a refused database role, a broker
user or virtual host refused) ends each long-running role within seconds with one clear line and
exit status 78 (EX_CONFIG), instead of a warning every few seconds for ever. A database that
refuses connections for now (too many of them) is waited for instead."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import Engine, func, select
from sqlalchemy.engine import make_url

from sasflow.store.listen import libpq_dsn
from sasflow.store.schema import schedulers
from sasflow.transport.topology import Names
from tests import harness, services
from tests.acceptance.processes import Processes, processes
from tests.conftest import DatabaseRoles

pytestmark = pytest.mark.acceptance

EX_CONFIG = 78
WITHIN_S = 20.0
"""A refusal is seen at the first connection: seconds, not the reconnect loop's minutes."""


def _refused(procs: Processes, *args: str) -> str:
    """Run `sasflow ARGS` and return its output, having checked that it ended with status 78
    and one error line, without a single reconnection attempt."""
    started = time.monotonic()
    result = procs.run(*args, timeout=WITHIN_S * 2)
    took = time.monotonic() - started
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if "Error:" in line or " ERROR " in line]
    assert result.returncode == EX_CONFIG, output
    assert len(errors) == 1, output
    assert "reconnecting" not in output
    assert "retrying" not in output
    assert took < WITHIN_S, f"{args} took {took:.1f}s"
    return errors[0]


@pytest.fixture
def procs(tmp_path: Path, names: Names) -> Iterator[Processes]:
    with processes(tmp_path, database_url="unset", namespace=names.namespace) as p:
        yield p


@pytest.mark.parametrize("role", ["scheduler", "submitter", "supervisor"])
def test_a_database_that_does_not_exist_ends_the_role_with_ex_config(
    procs: Processes, role: str
) -> None:
    missing = services.unique("sasflow_missing")
    procs.env["SASFLOW_DATABASE_URL"] = services.database_url(missing)
    line = _refused(procs, role)
    assert f'database "{missing}" does not exist' in line


def test_a_database_role_refused_ends_the_scheduler_with_ex_config(
    procs: Processes, template_database: str
) -> None:
    """The test server trusts local connections, so a wrong password goes unnoticed there: a
    role that does not exist is refused the same way (SQLSTATE 28000 instead of 28P01)."""
    nobody = services.unique("sf_nobody")
    procs.env["SASFLOW_DATABASE_URL"] = services.database_url(template_database, user=nobody)
    line = _refused(procs, "scheduler")
    assert f'role "{nobody}" does not exist' in line


@pytest.fixture
def broker_user() -> Iterator[str]:
    """A throwaway RabbitMQ user with a password and no permission on any virtual host."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        pytest.skip("rabbitmqctl is needed to create a broker user")
    name = services.unique("sf_user")
    subprocess.run([ctl, "-q", "add_user", name, "pw"], check=True, timeout=60)
    try:
        yield name
    finally:
        subprocess.run([ctl, "-q", "delete_user", name], check=False, timeout=60)


def _broker_as(user: str, password: str, vhost: str = "%2F") -> str:
    url = make_url(services.broker_url().replace("amqp://", "postgresql://", 1))
    return f"amqp://{user}:{password}@{url.host}:{url.port or 5672}/{vhost}"


def test_a_broker_user_without_access_to_the_vhost_ends_the_agent_with_ex_config(
    procs: Processes, database_url: str, broker_user: str
) -> None:
    procs.env["SASFLOW_DATABASE_URL"] = database_url
    procs.env["SASFLOW_BROKER_URL"] = _broker_as(broker_user, "pw")
    line = _refused(procs, "agent", "echo")
    assert "access to vhost" in line


def test_a_wrong_broker_password_ends_the_scheduler_with_ex_config(
    procs: Processes, database_url: str, broker_user: str
) -> None:
    procs.env["SASFLOW_DATABASE_URL"] = database_url
    procs.env["SASFLOW_BROKER_URL"] = _broker_as(broker_user, "wrong")
    line = _refused(procs, "scheduler")
    assert "ACCESS_REFUSED" in line


def test_a_virtual_host_that_does_not_exist_ends_the_agent_with_ex_config(
    procs: Processes, database_url: str
) -> None:
    procs.env["SASFLOW_DATABASE_URL"] = database_url
    url = services.broker_url().rsplit("/", 1)[0]
    procs.env["SASFLOW_BROKER_URL"] = f"{url}/{services.unique('sf_novhost')}"
    line = _refused(procs, "agent", "echo")
    assert "not found" in line


def test_a_broker_user_refused_the_namespace_ends_the_agent_with_ex_config(
    procs: Processes, database_url: str, broker_user: str
) -> None:
    """The user may use the virtual host, but not the names of this namespace: the first
    declare is refused (403), which is the same misconfiguration."""
    ctl = shutil.which("rabbitmqctl")
    assert ctl is not None
    other = "^someone-else\\."
    subprocess.run(
        [ctl, "-q", "set_permissions", "-p", "/", broker_user, other, other, other],
        check=True,
        timeout=60,
    )
    procs.env["SASFLOW_DATABASE_URL"] = database_url
    procs.env["SASFLOW_BROKER_URL"] = _broker_as(broker_user, "pw")
    line = _refused(procs, "agent", "echo")
    assert "ACCESS_REFUSED" in line


# -- too many connections: wait, do not exit ------------------------------------------------


@contextlib.contextmanager
def limited_role(database_roles: DatabaseRoles, limit: int) -> Iterator[str]:
    """A role with the runtime role's privileges and at most `limit` connections."""
    name = services.unique("sf_limited")
    with psycopg.connect(libpq_dsn(services.admin_url()), autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {} CONNECTION LIMIT {}").format(
                sql.Identifier(name), sql.Identifier(database_roles.runtime), sql.Literal(limit)
            )
        )
        try:
            yield name
        finally:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _registered(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(schedulers)).scalar_one())


def test_a_scheduler_refused_for_too_many_connections_waits_and_then_serves(
    procs: Processes,
    database_url: str,
    engine: Engine,
    database_roles: DatabaseRoles,
) -> None:
    limit = 3
    with limited_role(database_roles, limit) as role:
        url = services.with_user(database_url, role)
        held = [psycopg.connect(libpq_dsn(url)) for _ in range(limit)]
        try:
            procs.env["SASFLOW_DATABASE_URL"] = url
            procs.start("scheduler", "scheduler")
            harness.wait_for(
                lambda: "too many connections" in procs.log("scheduler"),
                timeout=30,
                what="the scheduler to be refused a connection",
            )
            time.sleep(1.0)
            procs.assert_alive()
            assert _registered(engine) == 0
        finally:
            for conn in held:
                conn.close()
        harness.wait_for(lambda: _registered(engine) == 1, timeout=30, what="registration")
        procs.signal("scheduler", 15)
        assert procs.wait("scheduler") == 0
