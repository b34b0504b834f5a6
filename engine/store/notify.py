"""Wake sleeping schedulers when work becomes ready (PostgreSQL LISTEN/NOTIFY).

NOTIFY is transactional: it is delivered when the transaction that made the work ready commits.
SQLite has no notifications: there schedulers rescan often instead (dialect.rescan_interval).
"""

from __future__ import annotations

from sqlalchemy import Connection, func, select

from sasflow.store.dialect import has_notifications


def channel(namespace: str) -> str:
    """The notification channel of one namespace (quoted wherever it is used as an identifier)."""
    return f"sasflow:{namespace}:ready"


def notify_ready(conn: Connection, namespace: str) -> None:
    """Queue a wake-up for every listening scheduler, sent at commit (nothing on SQLite)."""
    if has_notifications(conn):
        conn.execute(select(func.pg_notify(channel(namespace), "")))
