"""Test-owned databases and namespaces on the real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from sasflow.store.listen import libpq_dsn
from sasflow.transport.topology import Names

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_BROKER_URL = "amqp://localhost:5672/%2F"


def admin_url() -> str:
    return os.environ.get("SASFLOW_DATABASE_URL", DEFAULT_ADMIN_URL)


def broker_url() -> str:
    return os.environ.get("SASFLOW_BROKER_URL", DEFAULT_BROKER_URL)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def database_url(name: str, *, user: str | None = None) -> str:
    """The URL of database `name` on the admin URL's server, as the admin or as `user` (the
    test server trusts local connections: no password)."""
    url = make_url(admin_url()).set(database=name)
    if user is not None:
        url = url.set(username=user, password=None)
    return url.render_as_string(hide_password=False)


def with_user(url: str, user: str) -> str:
    """`url` connecting as `user` instead (no password: the test server trusts local ones)."""
    return make_url(url).set(username=user, password=None).render_as_string(hide_password=False)


ROLES_SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "postgresql" / "roles.sql"


def apply_roles_script(
    database: str, *, owner: str, runtime: str, readonly: str, admin: str | None = None
) -> None:
    """Run the shipped deploy/postgresql/roles.sql as the admin (`admin`, a superuser's URL;
    the shared server's by default): the roles (created when missing) and `database` (owned
    by `owner`, created when missing) with their grants."""
    url = make_url(admin or admin_url())
    psql = shutil.which("psql")
    assert psql is not None, "psql is needed to run deploy/postgresql/roles.sql"
    variables = {"db": database, "owner": owner, "runtime": runtime, "readonly": readonly}
    subprocess.run(
        [
            psql,
            "-X",
            "-q",
            "-h",
            url.host or "127.0.0.1",
            "-p",
            str(url.port or 5432),
            "-U",
            url.username or "postgres",
            *(arg for name, value in variables.items() for arg in ("-v", f"{name}={value}")),
            "-f",
            str(ROLES_SCRIPT),
            url.database or "postgres",
        ],
        check=True,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PGPASSWORD": url.password or ""},
    )


def drop_roles(*names: str) -> None:
    """Drop roles this session created (their databases are gone already)."""
    with _admin() as conn:
        for name in names:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def _admin(url: str | None = None) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(libpq_dsn(url or admin_url()), autocommit=True)


def create_database(
    name: str, template: str | None = None, owner: str | None = None, *, admin: str | None = None
) -> None:
    """CREATE DATABASE as `admin` (a superuser's URL; default: the environment's, read now)."""
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    if owner is not None:
        statement += sql.SQL(" OWNER {}").format(sql.Identifier(owner))
    with _admin(admin) as conn:
        conn.execute(statement)


def drop_database(name: str, *, admin: str | None = None) -> None:
    with _admin(admin) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _listed(kind: str) -> list[str]:
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        return []
    out = subprocess.run(
        [ctl, "-q", kind, "name"], capture_output=True, text=True, timeout=60, check=False
    )
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def delete_known(names: Names) -> None:
    """Delete the queues and exchanges `names` knows of, over AMQP (a test's own; fast)."""
    queues = names.all_queues([])
    exchanges = [
        names.status,
        names.alerts,
        names.dead_letter_exchange,
        names.fleet,
        names.control,
    ]
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(broker_url()))) as conn:
        channel = conn.channel()
        for queue in queues:
            channel.queue_delete(queue)
        for exchange in exchanges:
            channel.exchange_delete(exchange)


def delete_namespaces(namespaces: Iterable[str]) -> None:
    """Delete every queue and exchange of `namespaces` (this session's own, nobody else's).

    One `rabbitmqctl` listing for the whole session: each call starts an Erlang VM (about half a
    second), too slow to pay per test. Queues a test declared under names `Names` does not know
    (agent queues, reply queues) are found here.
    """
    prefixes = tuple(f"{namespace}." for namespace in namespaces)
    if not prefixes:
        return
    queues = [q for q in _listed("list_queues") if q.startswith(prefixes)]
    exchanges = [e for e in _listed("list_exchanges") if e.startswith(prefixes)]
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(broker_url()))) as conn:
        channel = conn.channel()
        for queue in sorted(queues):
            channel.queue_delete(queue)
        for exchange in sorted(exchanges):
            channel.exchange_delete(exchange)


def delete_namespace(namespace: str, known_queues: list[str]) -> None:
    """Delete every queue and exchange of `namespace` now (a benchmark's, at its end)."""
    delete_namespaces([namespace])
    with broker_channel() as channel:
        for queue in known_queues:
            channel.queue_delete(queue)


@contextlib.contextmanager
def broker_channel() -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(broker_url()))) as conn:
        yield conn.channel()


def queue_exists(queue: str) -> bool:
    """True once `queue` has been declared (a passive declare on a channel of its own)."""
    try:
        with broker_channel() as channel:
            channel.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker:
        return False
    return True


def queue_figure(queue: str, column: str) -> int | None:
    """One figure `rabbitmqctl list_queues` shows of `queue` (`consumers`,
    `messages_unacknowledged`, ...), None while the queue is not listed (a read-only listing)."""
    ctl = shutil.which("rabbitmqctl")
    assert ctl is not None, f"rabbitmqctl is needed to read a queue's {column}"
    out = subprocess.run(
        [ctl, "-q", "list_queues", "name", column],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for line in out.splitlines():
        name, _, figure = line.strip().rpartition("\t")
        if name == queue:
            return int(figure)
    return None
