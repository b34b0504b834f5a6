"""Test-owned databases and namespaces on the real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pika
import pika.exceptions
import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from sasflow.store.listen import libpq_dsn

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_BROKER_URL = "amqp://localhost:5672/%2F"


def admin_url() -> str:
    return os.environ.get("SASFLOW_DATABASE_URL", DEFAULT_ADMIN_URL)


def broker_url() -> str:
    return os.environ.get("SASFLOW_BROKER_URL", DEFAULT_BROKER_URL)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def database_url(name: str) -> str:
    """The URL of database `name` on the admin URL's server."""
    return make_url(admin_url()).set(database=name).render_as_string(hide_password=False)


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(libpq_dsn(admin_url()), autocommit=True)


def create_database(name: str, template: str | None = None) -> None:
    with _admin() as conn:
        if template is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        else:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )


def drop_database(name: str) -> None:
    with _admin() as conn:
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


def delete_namespace(namespace: str, known_queues: list[str]) -> None:
    """Delete every queue and exchange of `namespace` (the test's own, nobody else's)."""
    prefix = f"{namespace}."
    queues = {q for q in _listed("list_queues") + known_queues if q.startswith(prefix)}
    exchanges = {e for e in _listed("list_exchanges") if e.startswith(prefix)}
    exchanges |= {f"{namespace}.{n}" for n in ("status", "alerts", "dlx")}
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(broker_url()))) as conn:
        channel = conn.channel()
        for queue in sorted(queues):
            channel.queue_delete(queue)
        for exchange in sorted(exchanges):
            channel.exchange_delete(exchange)


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
