"""Operator view and control of the scheduler cluster: list (with K, S, N, X, M and each
scheduler's state; with the scope strategy, the leader, plan epoch and ranges), the scope
plan, drain and undrain (the offline list, keyed by scheduler name)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from sasflow.errors import InvalidActionError, SchedulerNotFoundError
from sasflow.scheduler.cluster.limits import hold_limit
from sasflow.store.cluster import registrations, schedules, shard
from sasflow.store.cluster.lease import live_holder
from sasflow.store.db import Connection
from sasflow.store.operator.audit import AuditRecord, record


class SchedulerState(StrEnum):
    """A scheduler as `sasflow schedulers list` shows it."""

    ONLINE = "online"
    DRAINING = "draining"
    """On the offline list, still holding schedules."""
    DRAINED = "drained"
    """On the offline list and holding none: safe to stop."""
    DEAD = "dead"
    """Its lease expired: what it held is acquirable by the others."""


LEADER_LEASE = "shard-leader"
"""The scope strategy's leader lease (scheduler/cluster/scope.py)."""


def plan_view(conn: Connection) -> dict[str, Any]:
    """The scope strategy's plan: epoch, state (`ready`, `resharding`, or `none` before the
    first plan), the live leader's name (None: nobody leads now), K and S it was computed
    for, and per scheduler its positions first..last, size and the ids it covers."""
    state = shard.plan_state(conn)
    holder = live_holder(conn, LEADER_LEASE)
    names = {row["id"]: row["name"] for row in registrations.cluster(conn)}
    if state is None:
        return {"epoch": None, "state": "none", "leader": names.get(holder or ""), "ranges": []}
    ranges = shard.plan_ranges(conn, state["epoch"]) if state["ready"] else []
    return {
        "epoch": state["epoch"],
        "state": "ready" if state["ready"] else "resharding",
        "leader": names.get(holder or ""),
        "K": state["active"],
        "S": state["live"],
        "ranges": [
            {
                "position": r["position"],
                "name": r["name"],
                "address": r["address"],
                "first": r["first"],
                "last": r["last"],
                "size": max(0, r["last"] - r["first"] + 1),
                "lo_id": r["lo_id"],
                "hi_id": r["hi_id"],
                "registration": r["scheduler_id"],
            }
            for r in ranges
        ],
    }


def range_text(first: int, last: int) -> str:
    """Positions first..last as `sasflow schedulers list|plan` show them (`-` when empty)."""
    return f"{first}-{last}" if last >= first else "-"


def cluster_view(conn: Connection) -> list[dict[str, Any]]:
    """Per scheduler: name, address, state, K, S, N, X, M and lease age in seconds; with the
    scope strategy also whether it leads, the plan epoch and its range (N is then the size of
    its range). Names on the offline list with no registration are shown drained."""
    active = schedules.count_active(conn)
    live = registrations.count_live(conn)
    plan = plan_view(conn)
    ranges = {r["name"]: r for r in plan["ranges"]}
    view: list[dict[str, Any]] = []
    for row in registrations.cluster(conn):
        scope = row["assignment"] == "scope"
        planned = ranges.get(row["name"]) if row["live"] else None
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
                "N": (planned["size"] if planned else 0)
                if scope
                else hold_limit(active, live, row["fault_tolerance"]),
                "X": row["held"],
                "M": row["alarm_threshold"],
                "n": row["fault_tolerance"],
                "lease_age_s": round((row["now"] - row["heartbeat_at"]).total_seconds(), 1),
                "lease_ttl_s": row["lease_ttl_s"],
                "registration": row["id"],
                "assignment": row["assignment"],
                "leader": scope and row["live"] and row["name"] == plan["leader"],
                "epoch": plan["epoch"] if scope else None,
                "range": _range_of(plan, planned) if scope and row["live"] else None,
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
            "assignment": None,
            "leader": False,
            "epoch": None,
            "range": None,
        }
        for entry in registrations.offline_list(conn)
        if entry["name"] not in registered
    )
    return view


def _range_of(plan: dict[str, Any], planned: dict[str, Any] | None) -> str:
    if plan["state"] != "ready":
        return str(plan["state"])
    return "-" if planned is None else range_text(planned["first"], planned["last"])


def drain(conn: Connection, name: str, *, actor: str, reason: str | None, namespace: str) -> None:
    """Put `name` on the offline list: it stops acquiring and releases what it holds."""
    if not registrations.name_known(conn, name):
        raise SchedulerNotFoundError(f"no scheduler named {name!r} is registered")
    if not registrations.set_offline(conn, name, actor=actor, reason=reason):
        raise InvalidActionError(f"scheduler {name!r} is on the offline list already")
    record(conn, AuditRecord(actor, "schedulers.drain", reason, {"name": name}))
    schedules.notify_changed(conn, namespace)


def undrain(conn: Connection, name: str, *, actor: str, reason: str | None, namespace: str) -> None:
    """Take `name` off the offline list: it may acquire again, then acquires (at its next
    wake-up, which this commit's notification causes)."""
    if not registrations.clear_offline(conn, name):
        raise InvalidActionError(f"scheduler {name!r} is not on the offline list")
    record(conn, AuditRecord(actor, "schedulers.undrain", reason, {"name": name}))
    schedules.notify_changed(conn, namespace)
