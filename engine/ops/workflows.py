"""Per-workflow figures for people: recent totals of every workflow, and one workflow's
throughput, failure rate and p50/p95 duration over a window, from the database."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sasflow.errors import InvalidActionError
from sasflow.store.db import Connection
from sasflow.store.operator import charts
from sasflow.store.operator.charts import Series

__all__ = ["WINDOWS", "Series", "Window", "series", "totals", "window"]

HOUR_S = 3600.0
DAY_S = 86400.0


@dataclass(frozen=True)
class Window:
    """A chart's time span and its bucket."""

    name: str
    seconds: float
    bucket_s: float
    bucket_label: str


WINDOWS = (
    Window("1h", HOUR_S, 60.0, "1 min"),
    Window("24h", DAY_S, 1800.0, "30 min"),
    Window("7d", 7 * DAY_S, 3 * HOUR_S, "3 h"),
)
"""The windows a workflow's charts offer: 60, 48 and 56 buckets."""


def window(name: str) -> Window:
    """The window called `name` (1h, 24h, 7d), else InvalidActionError."""
    for found in WINDOWS:
        if found.name == name:
            return found
    names = ", ".join(w.name for w in WINDOWS)
    raise InvalidActionError(f"unknown window {name!r}: one of {names}")


def totals(conn: Connection, known: Iterable[str]) -> list[dict[str, Any]]:
    """Every workflow the app knows (`known`) or that finished runs in the last day: runs
    finished in the last hour and day, and the day's failure rate (None without a run)."""
    found = {
        str(row["workflow"]): row
        for row in charts.workflow_totals(conn, hour_s=HOUR_S, day_s=DAY_S)
    }
    names = sorted(set(found) | set(known))
    rows = []
    for name in names:
        row = found.get(name, {"finished_hour": 0, "finished_day": 0, "failed_day": 0})
        day = int(row["finished_day"])
        rows.append(
            {
                "workflow": name,
                "finished_hour": int(row["finished_hour"]),
                "finished_day": day,
                "failed_day": int(row["failed_day"]),
                "failure_rate": int(row["failed_day"]) / day if day else None,
            }
        )
    return rows


def series(conn: Connection, workflow: str, chosen: Window) -> Series:
    """The workflow's finished runs per bucket over the window."""
    return charts.workflow_series(conn, workflow, window_s=chosen.seconds, bucket_s=chosen.bucket_s)
