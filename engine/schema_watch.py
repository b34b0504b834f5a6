"""What a running role says while the database's schema is not the one it needs.

A statement that names a table or column the schema lacks raises SchemaOutdatedError (the
store's translation); the role holds its work and retries as in an outage. Told through one
`SchemaWatch`, it says so once: one ERROR line naming the database's revision and the head
(`database at (empty), head is 0013: run `sasflow db upgrade``), then nothing while it
retries, and one line when the schema is back (docs/operations.md).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from sasflow.errors import SasflowError, SchemaOutdatedError
from sasflow.store.db import Engine

if TYPE_CHECKING:
    from sasflow.store.migrate import SchemaStatus

log = logging.getLogger(__name__)

LOOK_EVERY_S = 5.0
"""While it waits, the database's revision is read at most this often (by `ok`)."""

QUIET_S = 60.0
"""When the revision did not explain the failure (the schema is at head: changed by hand, or
a newer sasflow's migration dropped something), the role is said to have resumed only after
this long without a failure: one line a minute at most, whatever its loops do."""


class SchemaWatch:
    """One per role (its loops and threads share it): `failed` when a statement failed for
    want of the schema, `ok` after a pass of work that succeeded. Thread-safe."""

    def __init__(
        self,
        engine: Engine,
        name: str,
        *,
        look_every: float = LOOK_EVERY_S,
        quiet: float = QUIET_S,
    ) -> None:
        self._engine = engine
        self._name = name
        self._look_every = look_every
        self._quiet = quiet
        self._lock = threading.Lock()
        self.waiting = False
        """True from the first failure until the role is said to have resumed."""
        self._explained = False
        """The revision explained the failure (the database was behind its head)."""
        self._failed_at = 0.0
        self._look_at = 0.0

    def failed(self, exc: SchemaOutdatedError) -> None:
        """Say it, if this is the first failure since the role last worked."""
        with self._lock:
            self._failed_at = time.monotonic()
            if self.waiting:
                return
            self.waiting = True
            self._explained = False
            self._look_at = self._failed_at + self._look_every
        status = self._status()
        self._explained = status is not None and status.behind
        if status is None:
            said = str(exc)
        elif status.behind:
            said = status.sentence()
        else:
            said = (
                f"{exc}; the database is at {status.current}, head {status.head}: a table or "
                "column was changed by hand, or this sasflow is older than the database"
            )
        log.error("%s: %s; retrying quietly until then", self._name, said)

    def ok(self) -> None:
        """A pass of work succeeded: say that the role resumed once the schema is back (its
        revision at head, or ahead), or after `quiet` seconds (QUIET_S) without a failure when
        the revision never explained it. Costs one attribute read while nothing is wrong."""
        if not self.waiting:
            return
        now = time.monotonic()
        if now < self._look_at or not self._lock.acquire(blocking=False):
            return
        try:
            self._look_at = now + self._look_every
            if self._explained:
                status = self._status()
                if status is None or status.behind:
                    return
                said = f"database at {status.current}"
            elif now - self._failed_at >= self._quiet:
                said = f"no statement failed for want of the schema in {self._quiet:.0f}s"
            else:
                return
            self.waiting = False
        finally:
            self._lock.release()
        log.info("%s: %s: resumed", self._name, said)

    def check(self) -> None:
        """Read the database's revision now (a readiness probe): raise SchemaOutdatedError,
        said as a failure, when it is empty or behind the head; else count as a pass that
        succeeded. The store's errors (unreachable) are raised as they are."""
        status = _read(self._engine)
        if status.behind:
            exc = SchemaOutdatedError(status.sentence())
            self.failed(exc)
            raise exc
        self.ok()

    def _status(self) -> SchemaStatus | None:
        try:
            return _read(self._engine)
        except SasflowError:
            return None


def _read(engine: Engine) -> SchemaStatus:
    # Alembic is imported when a schema is first in doubt: a role starts without it (the
    # agent command's module imports the roles').
    from sasflow.store import migrate  # noqa: PLC0415

    return migrate.schema_status(engine)
