"""Leader election for the supervisor: a lease row with a fencing token.

At most one supervisor acts at a time. The holder renews its lease every sweep; a paused or
dead holder's lease expires (database clock) and another supervisor takes it over with the
token incremented. Every sweep transaction first locks the lease row and checks that it still
holds the token it acquired, so a leader that wakes up after losing its lease does nothing,
and a takeover waits for the current sweep transaction to end.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, update

from sasflow.errors import SasflowError
from sasflow.store.db import transaction
from sasflow.store.dialect import upsert_insert
from sasflow.store.schema import leases
from sasflow.store.sqltime import now, plus_seconds

SUPERVISOR = "supervisor"


class LeaseLostError(SasflowError):
    """Another supervisor holds the lease now; this one must stop acting."""


class Lease:
    """This process's claim on a singleton role."""

    def __init__(self, holder: str, *, ttl: float, name: str = SUPERVISOR) -> None:
        self.holder = holder
        self.name = name
        self.ttl = ttl
        self.token: int | None = None

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
        """Inside a sweep transaction: lock the lease row, make sure it is still ours, and
        extend it (a long sweep renews its lease batch by batch)."""
        if self._extend(conn) is None:
            self.token = None
            raise LeaseLostError(f"{self.holder} no longer holds the {self.name} lease")

    def _extend(self, conn: Connection) -> int | None:
        """Push our unexpired lease's end out by the TTL (locking its row); its token, or None
        when the lease is no longer ours."""
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
        """Give the lease up (on shutdown) so another supervisor need not wait for it."""
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
