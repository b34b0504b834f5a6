"""Reading the audit trail (`sasflow audit list`): the operators' and the supervisor's actions
that have no run to record an event on (docs/operations.md#the-audit-trail)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sasflow.errors import InvalidActionError
from sasflow.store.db import Connection
from sasflow.store.operator import audit

MAX_LIMIT = 10_000


@dataclass(frozen=True)
class AuditFilter:
    """Which records to list; every given condition must hold."""

    since: datetime | float | None = None
    """Created at or after this time, or this many seconds before the database's now."""
    actor: str | None = None
    """Exactly this actor (`alice@ops-1`, `supervisor-…`, a token's name)."""
    action: str | None = None
    """Exactly this action (`dead.purge`), or every action of a family (`dead.`, `dead`)."""
    limit: int = 100


def list_audit(conn: Connection, where: AuditFilter) -> list[dict[str, Any]]:
    """The newest records `where` selects, newest first."""
    if not 1 <= where.limit <= MAX_LIMIT:
        raise InvalidActionError(f"the limit must be between 1 and {MAX_LIMIT}")
    if isinstance(where.since, float | int) and where.since < 0:
        raise InvalidActionError("--since cannot be in the future")
    action = where.action
    if action is not None and "." not in action:
        action += "."  # a family: `dead` lists dead.replay, dead.purge, dead.expire
    return audit.recent(
        conn, action=action, limit=where.limit, since=where.since, actor=where.actor
    )
