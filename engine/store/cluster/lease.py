"""Leader election for a singleton role: a lease row with a fencing token, on the database clock.

Any number of processes may compete for one role (the supervisor, a leading scheduler...);
the one holding the role's lease acts. Each role names its own lease (the row's primary key);
this module knows no role.

- **Acquire or renew** (`acquire`, in its own transaction): the holder pushes `expires_at` out
  by the TTL while its token is current and unexpired; anyone else takes the row only once
  `expires_at <= now()`, and taking it increments the token.
- **Check** (`check`, first statement of each transaction that acts for the role, in the
  caller's transaction): lock the row and make sure it still holds the token it acquired, and
  extend it (a long stretch of work renews its lease transaction by transaction). A holder
  that wakes up after losing its lease (GC pause, SIGSTOP, VM migration) finds its token stale
  and raises `LeaseLostError` instead of acting; because the check locks the row, a takeover
  also waits for the transaction in progress to end.
- **Release** (`release`, on shutdown): expire the lease now, so the next holder need not wait.

Every time comparison uses the database clock, so the holders' clocks need not agree.
"""

from __future__ import annotations

from sqlalchemy import select, update

from sasflow.errors import LeaseLostError
from sasflow.store.db import Connection, Engine, transaction
from sasflow.store.dialect import upsert_insert
from sasflow.store.schema import leases
from sasflow.store.sqltime import now, plus_seconds

SUPERVISOR_LEASE = "supervisor"
"""The supervisor's lease row (`leases.name`): one supervisor acts at a time."""


class Lease:
    """This process's claim on the singleton role `name` (a lease row, keyed by its name)."""

    def __init__(self, holder: str, *, name: str, ttl: float) -> None:
        self.holder = holder
        self.name = name
        self.ttl = ttl
        self.token: int | None = None
        """The fencing token while we hold the lease (None when we do not)."""

    def acquire(self, engine: Engine) -> bool:
        """Renew the lease, or take it if it is free or expired; True when we hold it."""
        with transaction(engine) as conn:
            if self.token is not None and self._extend(conn) is not None:
                return True
            statement = upsert_insert(conn, leases).values(
                name=self.name,
                holder=self.holder,
                token=1,
                expires_at=plus_seconds(now(), self.ttl),
            )
            taken = conn.execute(
                statement.on_conflict_do_update(
                    index_elements=[leases.c.name],
                    set_={
                        "holder": self.holder,
                        "token": leases.c.token + 1,
                        "acquired_at": now(),
                        "expires_at": statement.excluded.expires_at,
                    },
                    where=leases.c.expires_at <= now(),
                ).returning(leases.c.token)
            ).scalar_one_or_none()
        self.token = taken
        return taken is not None

    def check(self, conn: Connection) -> None:
        """Inside a transaction acting for the role: lock the lease row, make sure it is still
        ours, and extend it; LeaseLostError (and the token forgotten) when it is not."""
        if self._extend(conn) is None:
            self.token = None
            raise LeaseLostError(f"{self.holder} no longer holds the {self.name} lease")

    def _extend(self, conn: Connection) -> int | None:
        """Push our unexpired lease's end out by the TTL (locking its row, by primary key); its
        token, or None when the lease is no longer ours."""
        return conn.execute(
            update(leases)
            .where(
                leases.c.name == self.name,
                leases.c.holder == self.holder,
                leases.c.token == self.token,
                leases.c.expires_at > now(),
            )
            .values(expires_at=plus_seconds(now(), self.ttl))
            .returning(leases.c.token)
        ).scalar_one_or_none()

    def release(self, engine: Engine) -> None:
        """Give the lease up (on shutdown) so another process need not wait for it to expire."""
        if self.token is None:
            return
        with transaction(engine) as conn:
            conn.execute(
                update(leases)
                .where(
                    leases.c.name == self.name,
                    leases.c.holder == self.holder,
                    leases.c.token == self.token,
                )
                .values(expires_at=now())
            )
        self.token = None


def live_holder(conn: Connection, name: str) -> str | None:
    """Who holds the unexpired lease `name`, or None (primary key)."""
    return conn.execute(
        select(leases.c.holder).where(leases.c.name == name, leases.c.expires_at > now())
    ).scalar_one_or_none()
