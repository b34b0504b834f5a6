"""Schedules as rows: a definition's columns, and syncing the app's `Schedule`s to the table."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from sasflow.registry import Registry
from sasflow.schedules.definition import Schedule
from sasflow.store.cluster import schedules
from sasflow.store.db import Connection
from sasflow.store.operator.audit import database_now

log = logging.getLogger(__name__)

DEFINITION_COLUMNS = (
    "workflow",
    "input",
    "cron",
    "interval_s",
    "timezone",
    "catch_up",
    "max_catch_up",
)
TIMING_COLUMNS = ("cron", "interval_s", "timezone")


def definition_columns(schedule: Schedule) -> dict[str, Any]:
    """The columns that hold a schedule's definition."""
    return {
        "workflow": schedule.workflow,
        "input": schedule.input,
        "cron": schedule.cron,
        "interval_s": None if schedule.every is None else float(schedule.every),
        "timezone": schedule.timezone,
        "catch_up": str(schedule.policy),
        "max_catch_up": schedule.max_catch_up,
    }


def new_row(schedule: Schedule, *, source: str, now: dt.datetime) -> dict[str, Any]:
    """The row of a new schedule: its first tick is the first one after `now`."""
    return {
        "name": schedule.name,
        "source": source,
        **definition_columns(schedule),
        "next_tick_at": schedule.timing.next_after(now),
    }


def sync_app_schedules(conn: Connection, registry: Registry) -> int:
    """Insert the app's schedules that are not in the table and update the ones whose
    definition changed (a changed timing restarts from the next tick); returns how many
    changed. Schedules only in the table (added with the CLI) are left alone, and so are the
    paused flag and the owner."""
    changed = 0
    now = database_now(conn)
    for schedule in registry.schedules:
        existing = schedules.by_name(conn, schedule.name, lock=True)
        if existing is None:
            if (
                schedules.insert_schedule(conn, new_row(schedule, source="app", now=now))
                is not None
            ):
                changed += 1
            continue
        wanted = definition_columns(schedule)
        if all(existing[c] == wanted[c] for c in DEFINITION_COLUMNS):
            continue
        if any(existing[c] != wanted[c] for c in TIMING_COLUMNS):
            wanted["next_tick_at"] = schedule.timing.next_after(now)
        schedules.update_definition(conn, existing["id"], wanted)
        log.info("schedule %s updated from the app's definition", schedule.name)
        changed += 1
    return changed
