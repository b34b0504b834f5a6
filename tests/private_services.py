"""PostgreSQL and RabbitMQ instances of a test's own, for tests that stop, restart or
reconfigure a service: the machine's services (`tests/services.py`) are never touched.

The instances are the chaos suite's (`tests/chaos/instances.py`): started from the installed
binaries on free loopback ports, with their data under a fresh directory in /tmp, and stopped
and removed when the block ends, whatever ended it (a failure, a timeout, Ctrl-C or SIGTERM,
interpreter exit). They need root (PostgreSQL runs as the `postgres` user, RabbitMQ as root
with its own node name and cookie). `tests/unit/test_service_control.py` checks that no other
test module controls a server.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Protocol, TypeVar

import psycopg

from sasflow.store import migrate
from sasflow.store.db import make_engine
from tests import services
from tests.chaos.instances import PostgresInstance, RabbitInstance, ServiceError
from tests.cluster.local import LocalCluster

PREFIX = "sasflow-test"
"""Of the directories (/tmp/sasflow-test-*) and RabbitMQ node names (sasflow-test-*@localhost):
only a SIGKILL of the test process leaves one behind."""
OWNER, RUNTIME, READONLY = "sasflow_owner", "sasflow_runtime", "sasflow_readonly"
"""The roles of deploy/postgresql/roles.sql, on the instance only (no other session's names to
avoid there)."""


@dataclass(frozen=True)
class PrivatePostgres:
    """An instance with a template database made by the shipped roles script and migrated by
    its owner role; each test clones its own database from it."""

    instance: PostgresInstance
    template: str

    def new_database(self) -> str:
        """A fresh database cloned from the template; its URL as the runtime role, which the
        sasflow processes use (DML only, as in production)."""
        name = services.unique("sasflow_test")
        self.instance.admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}" OWNER {OWNER}')
        return _url(self.instance, RUNTIME, name)


def _url(instance: PostgresInstance, user: str, database: str) -> str:
    return f"postgresql+psycopg://{user}@127.0.0.1:{instance.port}/{database}"


class _Instance(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


T = TypeVar("T", bound=_Instance)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a cancelled CI job, `timeout`) ends the run as Ctrl-C does, so that pytest
    tears the fixtures down and the instances with them; by default it would end the process
    on the spot and leave them running. Left alone when someone else handles SIGTERM."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _thrown_away(what: str, make: Callable[[Path, str], T]) -> Iterator[T]:
    """An instance made by `make(directory, id)` in a fresh directory and started. When the
    block ends (or at interpreter exit, if it never does) the instance is stopped and its
    directory removed."""
    run_id = uuid.uuid4().hex[:8]
    root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-{what}-{run_id}-"))
    root.chmod(0o755)  # the postgres user must reach its data directory
    made: list[T] = []

    def close() -> None:
        try:
            for instance in made:
                instance.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)

    atexit.register(close)
    try:
        with _terminate_as_interrupt():
            made.append(make(root, run_id))
            try:
                made[0].start()
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ServiceError(f"could not start a private {what} instance: {exc}") from exc
            yield made[0]
    finally:
        atexit.unregister(close)
        close()


def _migrated_template(template: str, admin: str, owner: str) -> None:
    """Database `template` made by the shipped roles script (as `admin`, a superuser's URL)
    and migrated by its owner role (`owner`, that role's URL of it)."""
    services.apply_roles_script(
        template, owner=OWNER, runtime=RUNTIME, readonly=READONLY, admin=admin
    )
    engine = make_engine(owner, pool_size=1)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()


@contextlib.contextmanager
def postgres(say: Callable[[str], None] = print) -> Iterator[PrivatePostgres]:
    """A PostgreSQL instance of the caller's own, with a migrated template database."""
    started = time.monotonic()
    with _thrown_away("postgres", lambda root, _: PostgresInstance(root)) as instance:
        template = "sasflow_tpl"
        _migrated_template(
            template, _url(instance, "postgres", "postgres"), _url(instance, OWNER, template)
        )
        say(
            f"\n[private services] PostgreSQL on :{instance.port} ({instance.data}), "
            f"migrated, in {time.monotonic() - started:.1f}s"
        )
        yield PrivatePostgres(instance, template)


@contextlib.contextmanager
def rabbitmq(
    say: Callable[[str], None] = print, *, consumer_timeout: float | None = None
) -> Iterator[RabbitInstance]:
    """A RabbitMQ node of the caller's own (`url` for the processes, `stop_app()` and
    `start_app()` for the faults), with a `consumer_timeout` in seconds if given (default:
    RabbitMQ's, 30 minutes)."""
    started = time.monotonic()
    with _thrown_away(
        "rabbitmq",
        lambda root, run_id: RabbitInstance(
            root, run_id, prefix=PREFIX, consumer_timeout=consumer_timeout
        ),
    ) as instance:
        say(
            f"\n[private services] RabbitMQ {instance.node} on :{instance.port} in "
            f"{time.monotonic() - started:.1f}s"
        )
        yield instance


@dataclass(frozen=True)
class PrivateCluster:
    """The local cluster (tests/cluster) with a template database made by the shipped roles
    script and migrated by its owner role; each test clones its own database from it."""

    cluster: LocalCluster
    template: str

    def new_database(self) -> str:
        """A fresh database cloned from the template, on the current primary; its multi-host
        URL as the runtime role."""
        name = services.unique("sasflow_test")
        self.cluster.postgres.primary.admin(
            f'CREATE DATABASE "{name}" TEMPLATE "{self.template}" OWNER {OWNER}'
        )
        return self.cluster.database_url(RUNTIME, name)

    def drop_database(self, url: str) -> None:
        name = url.partition("@/")[2].partition("?")[0]
        self.cluster.postgres.primary.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def cluster(
    running: Path | None = None, say: Callable[[str], None] = print
) -> Iterator[PrivateCluster]:
    """The local cluster with a migrated template: the one started in `running` (by
    `scripts/cluster start`), taken over and left running, its nodes started again if a test
    left them down; else a throw-away one of the caller's own."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if running is not None:
            found = LocalCluster.load(running)
            if found is None:
                raise ServiceError(f"no cluster in {running}: run scripts/cluster start")
            found.attach()
            stack.callback(found.heal)
            local = found
        else:
            local = stack.enter_context(
                _thrown_away("cluster", lambda root, _: LocalCluster.new(root))
            )
        template = services.unique("sasflow_tpl")
        primary = local.postgres.primary
        _migrated_template(
            template, _url(primary, "postgres", "postgres"), local.database_url(OWNER, template)
        )
        say(
            f"\n[private services] cluster in {local.root} "
            f"({'taken over' if running else 'started'}, template migrated) in "
            f"{time.monotonic() - started:.1f}s"
        )
        private = PrivateCluster(local, template)
        try:
            yield private
        finally:
            with contextlib.suppress(ServiceError, psycopg.Error):
                private.drop_database(local.database_url(OWNER, template))
