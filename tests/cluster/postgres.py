"""A PostgreSQL primary and its synchronous standby on this machine: two servers, `pg_a` and
`pg_b`, on ports of their own; which one is the primary changes with each failover.

The standby streams as its name (`cluster_name`), which the primary lists in
`synchronous_standby_names` with `synchronous_commit = on`: a commit is acknowledged once the
standby has flushed it, so a promotion loses nothing acknowledged. On a failover the pair does
what a failover manager (Patroni in its default, non-strict synchronous mode) does: promote the
standby, let it commit alone until a standby is back, fence the old primary (stop it), then
rebuild it as the new primary's standby (a fresh base backup) and make that standby
synchronous again.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from tests.chaos.instances import PostgresInstance, PostgresStandby, ServiceError

NAMES = ("pg_a", "pg_b")


def _wait_sync(primary: PostgresInstance, standby: str, timeout: float = 60) -> None:
    """Until `standby` streams to `primary` as its synchronous standby."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(
            f"host=127.0.0.1 port={primary.port} user=postgres dbname=postgres", connect_timeout=5
        ) as conn:
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                (standby,),
            ).fetchone()
        if row == ("sync",):
            return
        time.sleep(0.2)
    raise ServiceError(f"{standby} did not become the synchronous standby of :{primary.port}")


class PostgresPair:
    def __init__(self, root: Path, ports: tuple[int, int]) -> None:
        self.root = root
        self.ports = ports
        first = PostgresInstance(root / NAMES[0], port=ports[0], name=NAMES[0])
        self.servers: dict[str, PostgresInstance] = {
            NAMES[0]: first,
            NAMES[1]: PostgresStandby(first, root / NAMES[1], port=ports[1], name=NAMES[1]),
        }
        self.primary_name = NAMES[0]

    @property
    def primary(self) -> PostgresInstance:
        return self.servers[self.primary_name]

    @property
    def standby_name(self) -> str:
        return next(name for name in NAMES if name != self.primary_name)

    @property
    def standby(self) -> PostgresInstance:
        return self.servers[self.standby_name]

    def url(self, user: str, database: str) -> str:
        """A multi-host URL naming both servers (libpq keeps the one that accepts writes)."""
        hosts = "&".join(f"host=127.0.0.1:{port}" for port in self.ports)
        return f"postgresql+psycopg://{user}@/{database}?{hosts}"

    def start(self) -> None:
        self.primary.start()
        self.standby.start()
        self.primary.synchronous_standbys(self.standby_name)
        _wait_sync(self.primary, self.standby_name)

    def attach(self) -> None:
        """Take over servers started by another process (heal() finds the primary)."""
        for server in self.servers.values():
            server.started = True

    def heal(self) -> list[str]:
        """Start the servers that are down and find the primary; a server whose data is gone
        (a rebuild cut short) is rebuilt as the primary's standby. The names of those
        started."""
        started, lost = [], []
        for name, server in self.servers.items():
            if server.running():
                continue
            if (server.data / "PG_VERSION").exists():
                server.ensure_running()
                started.append(name)
            else:
                lost.append(name)
        primaries = [
            name
            for name, server in self.servers.items()
            if name not in lost and not server.in_recovery()
        ]
        if len(primaries) != 1:
            raise ServiceError(f"expected one primary, found {primaries or 'none'}")
        self.primary_name = primaries[0]
        for name in lost:
            self.rebuild(name)
            started.append(name)
        return started

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()

    @contextmanager
    def promoted(self) -> Iterator[PostgresInstance]:
        """Promote the standby and make it commit alone; inside the block the old primary
        still runs (and its commits wait for a standby that is gone: none is acknowledged);
        when the block ends, the old primary is stopped and rebuilt as the new primary's
        synchronous standby."""
        old = self.promote()
        try:
            yield self.primary
        finally:
            self.fence(old)  # even when the block failed: two primaries must not both run

    def promote(self) -> str:
        """Promote the standby, which then commits alone; the old primary's name (it still
        runs: `fence` it)."""
        old_name, new_name = self.primary_name, self.standby_name
        new = self.servers[new_name]
        new.promote()
        new.synchronous_standbys(None)
        self.primary_name = new_name
        return old_name

    def fence(self, name: str) -> None:
        """Stop server `name`, a primary no longer, and rebuild it as the primary's
        synchronous standby."""
        self.servers[name].stop()
        self.rebuild(name)

    def rebuild(self, name: str) -> None:
        """Make server `name` (stopped) a fresh standby of the primary, synchronous again."""
        old = self.servers[name]
        shutil.rmtree(old.data, ignore_errors=True)
        standby = PostgresStandby(self.primary, old.root, port=old.port, name=name)
        self.servers[name] = standby
        standby.start()
        self.primary.synchronous_standbys(name)
        _wait_sync(self.primary, name)
