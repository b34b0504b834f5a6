"""Operator view and control of the scheduler cluster: list (with K, S, N, X, M and each
scheduler's state), drain and undrain (the offline list, keyed by scheduler name)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from sasflow.cluster.limits import hold_limit
from sasflow.errors import InvalidActionError, SchedulerNotFoundError
from sasflow.store import schedulers as store
from sasflow.store import schedules
from sasflow.store.audit import AuditRecord, record
from sasflow.store.db import Connection


class SchedulerState(StrEnum):
    """A scheduler as `sasflow schedulers list` shows it."""

    ONLINE = "online"
    DRAINING = "draining"
    """On the offline list, still holding schedules."""
    DRAINED = "drained"
    """On the offline list and holding none: safe to stop."""
    DEAD = "dead"
    """Its lease expired: what it held is acquirable by the others."""


def cluster_view(conn: Connection) -> list[dict[str, Any]]:
    """Per scheduler: name, address, state, K, S, N, X, M and lease age in seconds. Names on
    the offline list with no registration are shown drained (not running)."""
    active = schedules.count_active(conn)
    live = store.count_live(conn)
    view: list[dict[str, Any]] = []
    for row in store.cluster(conn):
        if not row["live"]:
            state = SchedulerState.DEAD
        elif row["offline"]:
            state = SchedulerState.DRAINING if row["held"] else SchedulerState.DRAINED
        else:
            state = SchedulerState.ONLINE
        view.append(
            {
                "name": row["name"],
                "address": row["address"],
                "state": str(state),
                "K": active,
                "S": live,
                "N": hold_limit(active, live, row["fault_tolerance"]),
                "X": row["held"],
                "M": row["alarm_threshold"],
                "n": row["fault_tolerance"],
                "lease_age_s": round((row["now"] - row["heartbeat_at"]).total_seconds(), 1),
                "lease_ttl_s": row["lease_ttl_s"],
                "registration": row["id"],
            }
        )
    registered = {v["name"] for v in view}
    view.extend(
        {
            "name": entry["name"],
            "address": None,
            "state": str(SchedulerState.DRAINED),
            "K": active,
            "S": live,
            "N": None,
            "X": 0,
            "M": None,
            "n": None,
            "lease_age_s": None,
            "lease_ttl_s": None,
            "registration": None,
        }
        for entry in store.offline_list(conn)
        if entry["name"] not in registered
    )
    return view


def drain(conn: Connection, name: str, *, actor: str, reason: str | None, namespace: str) -> None:
    """Put `name` on the offline list: it stops acquiring and releases what it holds."""
    if not store.name_known(conn, name):
        raise SchedulerNotFoundError(f"no scheduler named {name!r} is registered")
    if not store.set_offline(conn, name, actor=actor, reason=reason):
        raise InvalidActionError(f"scheduler {name!r} is on the offline list already")
    record(conn, AuditRecord(actor, "schedulers.drain", reason, {"name": name}))
    schedules.notify_changed(conn, namespace)


def undrain(conn: Connection, name: str, *, actor: str, reason: str | None, namespace: str) -> None:
    """Take `name` off the offline list: it may acquire again, then acquires (at its next
    wake-up, which this commit's notification causes)."""
    if not store.clear_offline(conn, name):
        raise InvalidActionError(f"scheduler {name!r} is not on the offline list")
    record(conn, AuditRecord(actor, "schedulers.undrain", reason, {"name": name}))
    schedules.notify_changed(conn, namespace)
