"""A real failover, on throw-away instances: a primary and its streaming standby on free
local ports (never the shared server). The roles' pool and LISTEN connection, given a
multi-host URL naming the standby first, reach the primary; when the primary dies and the
standby is promoted, writes and notifications resume on it with the same engine and listener.
A LISTEN connection on a standby is refused, and the listener keeps trying until the server
is a primary."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, text

from sasflow.errors import StoreUnavailableError
from sasflow.store.db import make_engine, transaction
from sasflow.store.listen import ReadyListener
from sasflow.store.notify import notify_ready
from tests import harness
from tests.chaos.instances import PostgresInstance, PostgresStandby, ServiceError

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLE = "failover_probe"


@pytest.fixture
def pair() -> Iterator[tuple[PostgresInstance, PostgresStandby]]:
    if shutil.which("runuser") is None:
        pytest.skip("runuser is needed to run private PostgreSQL instances")
    root = Path(tempfile.mkdtemp(prefix="sasflow-failover-"))
    root.chmod(0o755)  # the postgres user must reach its data directories
    primary = PostgresInstance(root / "primary")
    standby = PostgresStandby(primary, root / "standby")
    try:
        try:
            primary.start()
        except ServiceError as exc:
            pytest.skip(f"cannot start a private PostgreSQL: {exc}")
        with psycopg.connect(
            f"host=127.0.0.1 port={primary.port} user=sasflow_app dbname=sasflow", autocommit=True
        ) as conn:
            conn.execute(f"CREATE TABLE {TABLE} (n int)")
        standby.start()
        yield primary, standby
    finally:
        standby.stop()
        primary.stop()
        shutil.rmtree(root, ignore_errors=True)


def _url(*ports: int) -> str:
    hosts = "&".join(f"host=127.0.0.1:{port}" for port in ports)
    return f"postgresql+psycopg://sasflow_app@/sasflow?{hosts}"


def _write(engine: Engine) -> int:
    """One row written through the store; the port of the server that took it."""
    with transaction(engine) as conn:
        conn.execute(text(f"INSERT INTO {TABLE} VALUES (1)"))
        return int(conn.execute(text("SELECT inet_server_port()")).scalar_one())


class _Wakeups:
    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.count += 1


def _notify(engine: Engine) -> None:
    with transaction(engine) as conn:
        notify_ready(conn, "failover")


def test_the_pool_and_the_listener_follow_a_promotion(
    pair: tuple[PostgresInstance, PostgresStandby],
) -> None:
    primary, standby = pair
    url = _url(standby.port, primary.port)  # the standby first: only the primary accepts
    engine = make_engine(url, application_name="sasflow-failover-test", pool_size=2)
    wakeups = _Wakeups()
    listener = ReadyListener(url, "failover", wakeups, name="failover")
    try:
        assert _write(engine) == primary.port
        listener.start()
        harness.wait_for(lambda: wakeups.count == 1, timeout=20, what="listener connected")
        _notify(engine)
        harness.wait_for(lambda: wakeups.count == 2, timeout=5, what="NOTIFY on the primary")

        stopped = time.monotonic()
        primary.stop()  # immediate: the primary is gone with its connections
        standby.promote()  # waits until the standby is a primary
        promoted = time.monotonic() - stopped
        port, refused = _write_until_accepted(engine, timeout=30)
        resumed = time.monotonic() - stopped
        assert port == standby.port
        harness.wait_for(lambda: listener.connections == 2, timeout=20, what="listener back")
        listening = time.monotonic() - stopped
        print(
            f"after the primary stopped: promoted {promoted:.2f}s, writes {resumed:.2f}s "
            f"({refused} refused), LISTEN {listening:.2f}s"
        )
        before = wakeups.count
        _notify(engine)
        harness.wait_for(
            lambda: wakeups.count > before, timeout=5, what="NOTIFY on the new primary"
        )
    finally:
        listener.stop()
        engine.dispose()


def _write_until_accepted(engine: Engine, timeout: float) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    refused = 0
    while True:
        try:
            return _write(engine), refused
        except StoreUnavailableError:
            refused += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_listener_on_a_standby_waits_for_it_to_become_a_primary(
    pair: tuple[PostgresInstance, PostgresStandby],
) -> None:
    """LISTEN is refused during recovery; the listener retries (with backoff) and listens
    once the standby is promoted. The pool on the same standby reads but is refused writes."""
    _primary, standby = pair
    url = _url(standby.port)  # one host: no target_session_attrs, the standby is reached
    engine = make_engine(url, application_name="sasflow-failover-test", pool_size=2)
    wakeups = _Wakeups()
    listener = ReadyListener(url, "failover", wakeups, name="standby")
    try:
        with pytest.raises(StoreUnavailableError, match="read-only transaction"):
            _write(engine)
        listener.start()
        time.sleep(2.0)
        assert (listener.connections, wakeups.count) == (0, 0)
        standby.promote()
        harness.wait_for(lambda: listener.connections == 1, timeout=20, what="LISTEN accepted")
        assert _write_until_accepted(engine, timeout=10)[0] == standby.port
    finally:
        listener.stop()
        engine.dispose()
