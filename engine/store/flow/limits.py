"""The flow_limits and flow_buckets rows: operators' changes (with a wake-up of the
schedulers, which cache the limits), the claim's locks and writes, retention of idle buckets."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, Select, delete, func, select, update

from sasflow.errors import InvalidLimitError
from sasflow.store.dialect import has_notifications, upsert_insert
from sasflow.store.flow.model import KeyExpr, Limit
from sasflow.store.schema import flow_buckets, flow_limits
from sasflow.store.sqltime import now

log = logging.getLogger(__name__)


def channel(namespace: str) -> str:
    """The notification channel that tells schedulers the limits changed."""
    return f"sasflow:{namespace}:limits"


def notify_changed(conn: Connection, namespace: str) -> None:
    """Make every scheduler of the namespace read the limits again, at commit (nothing on
    SQLite: they read them every few seconds anyway)."""
    if has_notifications(conn):
        conn.execute(select(func.pg_notify(channel(namespace), "")))


def to_limit(row: Mapping[str, Any]) -> Limit:
    """A row as a validated Limit (InvalidLimitError for a row written around the services)."""
    return Limit(
        name=row["name"],
        agent=row["agent"],
        actions=None if row["actions"] is None else tuple(row["actions"]),
        dependency=row["dependency"],
        key=None if row["key"] is None else KeyExpr.parse(row["key"]),
        rate=row["rate"],
        burst=row["burst"],
        concurrency=row["concurrency"],
        enabled=bool(row["enabled"]),
    )


def _valid(rows: Iterable[Any]) -> list[Limit]:
    """The rows as limits, less any written around the services that is not valid (logged)."""
    found = []
    for row in rows:
        limit = _parsed(row._mapping)
        if isinstance(limit, Limit):
            found.append(limit)
        else:
            log.error("flow limit %r ignored: %s", row.name, limit)
    return found


def _parsed(row: Mapping[str, Any]) -> Limit | InvalidLimitError:
    try:
        return to_limit(row)
    except InvalidLimitError as exc:
        return exc


def all_rows(conn: Connection) -> list[dict[str, Any]]:
    """Every limit's row, by name (a scan of a table of operators' rows)."""
    return [
        dict(r._mapping) for r in conn.execute(select(flow_limits).order_by(flow_limits.c.name))
    ]


def find(conn: Connection, name: str, *, lock: bool = False) -> dict[str, Any] | None:
    """The limit's row (primary key), locked against claims and operators when `lock`."""
    query = select(flow_limits).where(flow_limits.c.name == name)
    if lock:
        query = query.with_for_update()
    row = conn.execute(query).first()
    return None if row is None else dict(row._mapping)


def enabled_limits(conn: Connection) -> list[Limit]:
    """The enabled limits, by name: what schedulers cache."""
    query = select(flow_limits).where(flow_limits.c.enabled).order_by(flow_limits.c.name)
    return _valid(conn.execute(query))


def lock_limits(
    conn: Connection, agents: Sequence[str]
) -> tuple[list[Limit], dict[str, datetime | None]]:
    """Lock the enabled limits of `agents` in name order and read them, with when each last
    admitted a step (ix_flow_limits_agent): the claims of one limit are serialized here, across
    every scheduler and host, and taking the locks in one order leaves no deadlock."""
    found = conn.execute(_locking(tuple(agents))).all()
    return _valid(found), {r.name: r.last_admitted_at for r in found}


@lru_cache(maxsize=256)
def _locking(agents: tuple[str, ...]) -> Select[Any]:
    return (
        select(flow_limits)
        .where(flow_limits.c.agent.in_(list(agents)), flow_limits.c.enabled)
        .order_by(flow_limits.c.name)
        .with_for_update()
    )


def save(conn: Connection, limit: Limit, *, actor: str, reason: str | None) -> bool:
    """Insert or replace the limit; True when it is new. A changed key forgets the buckets
    (their keys mean nothing under the new one)."""
    before = find(conn, limit.name, lock=True)
    values = {
        "name": limit.name,
        "agent": limit.agent,
        "actions": None if limit.actions is None else list(limit.actions),
        "dependency": limit.dependency,
        "key": None if limit.key is None else str(limit.key),
        "rate": limit.rate,
        "burst": limit.burst,
        "concurrency": limit.concurrency,
        "enabled": limit.enabled,
        "updated_by": actor,
        "reason": reason,
    }
    if before is None:
        conn.execute(upsert_insert(conn, flow_limits).values(values).on_conflict_do_nothing())
        return True
    conn.execute(
        update(flow_limits)
        .where(flow_limits.c.name == limit.name)
        .values(**values, updated_at=now())
    )
    if before["key"] != values["key"]:
        conn.execute(delete(flow_buckets).where(flow_buckets.c.limit_name == limit.name))
    return False


def remove(conn: Connection, name: str) -> bool:
    """Delete the limit and its buckets; False when there was none."""
    conn.execute(delete(flow_buckets).where(flow_buckets.c.limit_name == name))
    return conn.execute(delete(flow_limits).where(flow_limits.c.name == name)).rowcount > 0


# -- buckets -----------------------------------------------------------------------------------


def busy_buckets(
    conn: Connection, names: Sequence[str], at: datetime
) -> dict[tuple[str, str], datetime]:
    """(limit, key) -> tat of the buckets of `names` not idle at `at` (primary key): an idle
    bucket (tat past) holds a full burst, as a missing one does."""
    if not names:
        return {}
    rows = conn.execute(
        select(flow_buckets.c.limit_name, flow_buckets.c.key, flow_buckets.c.tat).where(
            flow_buckets.c.limit_name.in_(list(names)), flow_buckets.c.tat > at
        )
    )
    return {(r.limit_name, r.key): r.tat for r in rows}


def write_buckets(conn: Connection, tats: Mapping[tuple[str, str], datetime]) -> None:
    """Record the buckets' new `tat`s (an upsert per bucket, primary key)."""
    if not tats:
        return
    insert = upsert_insert(conn, flow_buckets)
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=[flow_buckets.c.limit_name, flow_buckets.c.key],
            set_={"tat": insert.excluded.tat},
        ),
        [{"limit_name": name, "key": key, "tat": tat} for (name, key), tat in tats.items()],
    )


def mark_admitted(conn: Connection, names: Sequence[str], at: datetime) -> None:
    """The limits `names` admitted steps at `at` (primary key; rows the claim holds locked)."""
    if names:
        conn.execute(
            update(flow_limits)
            .where(flow_limits.c.name.in_(list(names)))
            .values(last_admitted_at=at)
        )


def forget_idle_buckets(conn: Connection) -> int:
    """Delete the buckets whose `tat` passed (they hold a full burst, as no row does): retention
    of the keys no longer used (a scan of flow_buckets)."""
    return conn.execute(delete(flow_buckets).where(flow_buckets.c.tat < now())).rowcount
