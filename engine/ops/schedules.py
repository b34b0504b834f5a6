"""Operator actions on schedules: add, list, show, pause, resume, remove, trigger, release.

Each validates, calls the store, wakes the schedulers (NOTIFY) and is audited with its actor
and reason; the CLI (and later the HTTP API and the console) call these functions.
"""

from __future__ import annotations

from typing import Any

from sasflow.errors import InvalidActionError, ScheduleNotFoundError
from sasflow.registry import Registry
from sasflow.scheduler.cluster.firing import Target, submit_tick, tick_row, timing_of
from sasflow.scheduler.cluster.sync import new_row
from sasflow.schedules.definition import Schedule
from sasflow.store.cluster import registrations, schedules
from sasflow.store.db import Connection
from sasflow.store.notify import notify_ready
from sasflow.store.operator.audit import AuditRecord, database_now, record

SHOWN_TICKS = 10
MAX_ID = 2**63 - 1
"""Ids are PostgreSQL bigints: a longer run of digits can only be a name."""


def find(conn: Connection, ref: str, *, lock: bool = False) -> dict[str, Any]:
    """The schedule whose id (ASCII digits, within a bigint) or name is `ref`."""
    found = schedules.by_id(conn, int(ref), lock=lock) if _is_id(ref) else None
    if found is None:
        found = schedules.by_name(conn, ref, lock=lock)
    if found is None:
        raise ScheduleNotFoundError(f"no schedule with id or name {ref!r}")
    return found


def _is_id(ref: str) -> bool:
    # str.isdigit() is true for '²' (which int() refuses) and for other scripts' digits; the
    # length is checked first (int() refuses more than 4,300 digits).
    return ref.isascii() and ref.isdigit() and len(ref) <= len(str(MAX_ID)) and int(ref) <= MAX_ID


def _audit(
    conn: Connection, action: str, schedule: dict[str, Any], actor: str, reason: str | None
) -> None:
    detail = {"schedule_id": schedule["id"], "name": schedule["name"]}
    record(
        conn, AuditRecord(actor=actor, action=f"schedules.{action}", reason=reason, detail=detail)
    )


def add(
    conn: Connection,
    schedule: Schedule,
    registry: Registry,
    *,
    actor: str,
    reason: str | None,
    namespace: str,
) -> dict[str, Any]:
    """Add a schedule (its workflow must be in `registry`); it starts at its next tick."""
    registry.workflow(schedule.workflow)  # UnknownWorkflowError names it
    row = schedules.insert_schedule(conn, new_row(schedule, source="cli", now=database_now(conn)))
    if row is None:
        raise InvalidActionError(f"a schedule named {schedule.name!r} exists already")
    _audit(conn, "add", row, actor, reason)
    schedules.notify_changed(conn, namespace)
    return row


def list_schedules(conn: Connection) -> list[dict[str, Any]]:
    """Every schedule, with its owner's name and whether that owner is live."""
    return schedules.all_schedules(conn)


def show(conn: Connection, ref: str, *, ticks: int = SHOWN_TICKS) -> dict[str, Any]:
    """One schedule, its owner's name and whether that owner is live (as `list_schedules`
    says them), its last `ticks` ticks (newest first, with their runs) and its next tick."""
    schedule = find(conn, ref)
    owner = next((r for r in registrations.cluster(conn) if r["id"] == schedule["owner"]), None)
    schedule["owner_name"] = None if owner is None else owner["name"]
    schedule["owner_live"] = owner is not None and bool(owner["live"])
    schedule["ticks"] = schedules.recent_ticks(conn, schedule["id"], limit=ticks)
    schedule["timing"] = timing_of(schedule).describe()
    return schedule


def set_paused(
    conn: Connection, ref: str, *, paused: bool, actor: str, reason: str | None, namespace: str
) -> dict[str, Any]:
    """Pause (no tick fires; the schedule is released) or resume it (from its next tick: the
    ticks that fell due while it was paused are not fired)."""
    schedule = find(conn, ref, lock=True)
    if schedule["paused"] == paused:
        state = "paused" if paused else "not paused"
        raise InvalidActionError(f"schedule {schedule['name']!r} is {state} already")
    next_tick_at = timing_of(schedule).next_after(database_now(conn))
    schedules.set_paused(conn, schedule["id"], paused=paused, next_tick_at=next_tick_at)
    _audit(conn, "pause" if paused else "resume", schedule, actor, reason)
    schedules.notify_changed(conn, namespace)
    return find(conn, str(schedule["id"]))


def remove(
    conn: Connection, ref: str, *, actor: str, reason: str | None, namespace: str
) -> dict[str, Any]:
    """Delete a schedule and its tick history (the runs it made stay)."""
    schedule = find(conn, ref, lock=True)
    schedules.delete_schedule(conn, schedule["id"])
    _audit(conn, "remove", schedule, actor, reason)
    schedules.notify_changed(conn, namespace)
    return schedule


def release(
    conn: Connection, ref: str, *, actor: str, reason: str | None, namespace: str
) -> dict[str, Any]:
    """Free a schedule from its owner for any scheduler to acquire (manual balancing)."""
    schedule = find(conn, ref, lock=True)
    if not schedules.release(conn, schedule["id"]):
        raise InvalidActionError(f"schedule {schedule['name']!r} is not held by any scheduler")
    _audit(conn, "release", schedule, actor, reason)
    schedules.notify_changed(conn, namespace)
    return schedule


def trigger(
    conn: Connection,
    ref: str,
    registry: Registry,
    *,
    actor: str,
    reason: str | None,
    namespace: str,
) -> dict[str, Any]:
    """Fire the schedule now, once (a tick at the database's current time, which does not
    move its next tick); the tick with its run id, or its error."""
    schedule = find(conn, ref, lock=True)
    now = database_now(conn)
    run_id, error = submit_tick(
        conn, registry, Target.of(schedule), now, fired_by=actor, namespace=namespace
    )
    schedules.record_ticks(conn, [tick_row(schedule["id"], now, run_id, actor, error)])
    if run_id is not None:
        notify_ready(conn, namespace)
    _audit(conn, "trigger", schedule, actor, reason)
    tick = schedules.recent_ticks(conn, schedule["id"], limit=1)
    return {
        "schedule_id": schedule["id"],
        "name": schedule["name"],
        "tick_at": now,
        "run_id": run_id,
        "tick": tick[0] if tick else None,
    }
