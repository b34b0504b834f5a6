"""Inspect runs: list them with filters, show one with its steps and event timeline."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sasflow.errors import RunNotFoundError
from sasflow.ops import map_items as map_items_of
from sasflow.states import StepState
from sasflow.store.db import Connection
from sasflow.store.flow.explain import waiting_reasons
from sasflow.store.operator import audit, inspect
from sasflow.store.operator.inspect import RunFilter
from sasflow.store.runs import children
from sasflow.store.runs.parked import parked_steps

__all__ = [
    "RunFilter",
    "database_now",
    "get_run",
    "last_event_id",
    "list_runs",
    "overview",
    "runs_page",
    "show_run",
    "skip_reasons",
]


def list_runs(conn: Connection, where: RunFilter) -> list[dict[str, Any]]:
    """Runs matching `where`, newest first."""
    return inspect.list_runs(conn, where)


def runs_page(
    conn: Connection, where: RunFilter, *, cursor: int | None
) -> tuple[list[dict[str, Any]], int | None]:
    """One page of the runs matching `where` (newest first) after `cursor`, and the cursor of
    the next page (None on the last one)."""
    page = inspect.runs_page(conn, where, before_id=cursor)
    more = len(page) == where.limit
    return page, (int(page[-1]["id"]) if more and page else None)


def get_run(conn: Connection, run_id: int) -> dict[str, Any]:
    """The run's row (no steps, no events)."""
    run = inspect.run_row(conn, run_id)
    if run is None:
        raise RunNotFoundError(f"no run with id {run_id}")
    return run


def show_run(conn: Connection, run_id: int, *, map_items: int | None = None) -> dict[str, Any]:
    """The run, its steps (forward then compensation) and its whole event timeline. Each step
    says what it is `waiting` for when it is pending and held (a backoff, a flow limit, a
    breaker, no live agent instance, a paused run or agent; docs/flow-control.md), or is parked,
    else None, and why it was `skipped` (`skip_reasons`), else None; the run says which of its
    steps are `parked`, and its `children` (the ids of the runs its child steps started; its
    `parent_run_id` and `parent_step` are columns of its row). `map_items`: the items of maps
    grouped under their map's `map` summary, the first `map_items` of each listed
    (ops.map_items); None: every item, as a step of its own."""
    detail = inspect.run_detail(conn, run_id, map_items=map_items)
    if detail is None:
        raise RunNotFoundError(f"no run with id {run_id}")
    steps = [{**s, "run_id": run_id} for s in detail["steps"]]
    reasons = waiting_reasons(conn, steps)
    paused = bool(detail["run"].get("paused"))
    for step in detail["steps"]:
        step["waiting"] = reasons.get(int(step["id"]))
        if paused and step["state"] == StepState.PENDING:
            step["waiting"] = "run paused by an operator"
        if step["state"] == StepState.PARKED:
            step["waiting"] = "parked: an operator unparks or fails it"
    detail["run"]["parked"] = (
        [s["name"] for s in detail["steps"] if s["state"] == StepState.PARKED]
        if map_items is None
        else [r.name for r in parked_steps(conn, run_id)]  # items not listed too
    )
    detail["run"]["children"] = children.children_of(conn, [run_id])
    detail["failures"] = failures(detail["events"])
    why = skip_reasons(detail["events"])
    for step in detail["steps"]:
        step["skipped"] = why.get(step["id"]) if step["state"] == StepState.SKIPPED else None
    if map_items is not None:
        detail["steps"] = map_items_of.group(detail["steps"], detail.pop("map_counts"))
    return detail


def skip_reasons(timeline: list[dict[str, Any]]) -> dict[int, str]:
    """Why each skipped step was skipped, by step id, from its last skip event: the reason,
    and for a condition that did not hold the condition and the values it read
    (`condition false: steps.charge.captured == True; read steps.charge.captured=false`)."""
    found: dict[int, str] = {}
    for event in timeline:
        if event["entity"] != "step" or event["to_state"] != StepState.SKIPPED:
            continue
        text = event["reason"] or "skipped"
        detail = event["detail"]
        if isinstance(detail, dict) and "condition" in detail:
            values = detail.get("values") or {}
            read = ", ".join(f"{path}={json.dumps(v)}" for path, v in values.items())
            text = f"{text}: {detail['condition']}; read {read or 'nothing'}"
        elif isinstance(detail, dict) and "skipped" in detail:
            text = f"{text}: {', '.join(map(str, detail['skipped']))}"
        found[event["step_id"]] = text
    return found


def failures(timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every attempt that ended without success, oldest first, from the run's events: the
    history a resubmission keeps (it resets the steps' `error`, never the events). `outcome`
    is the event's reason (`error`, `expired`, `deferred`...), `error` the agent's error when
    it replied one."""
    found = []
    for event in timeline:
        if event["entity"] != "step" or event["from_state"] != StepState.PROCESSING:
            continue
        if event["to_state"] in (StepState.PROCESSING, StepState.PROCESSED):
            continue
        detail = event["detail"] if isinstance(event["detail"], dict) else {}
        found.append(
            {
                "at": event["created_at"],
                "step": event["step"],
                "step_id": event["step_id"],
                "attempt": event["attempt"],
                "outcome": event["reason"],
                "to_state": event["to_state"],
                "error": detail.get("error"),
                "by": event["actor"],
            }
        )
    return found


HOUR_S = 3600.0
DAY_S = 86400.0


def overview(conn: Connection) -> dict[str, Any]:
    """Runs by state created over the last hour and day, and runs finished in each window."""
    return {
        "hour": inspect.recent_runs_by_state(conn, seconds=HOUR_S),
        "day": inspect.recent_runs_by_state(conn, seconds=DAY_S),
        "finished_hour": inspect.finished_since(conn, seconds=HOUR_S),
        "finished_day": inspect.finished_since(conn, seconds=DAY_S),
    }


def last_event_id(conn: Connection) -> int:
    """The newest event's id (0: none yet): what the console's live pages watch."""
    return inspect.last_event_id(conn)


def database_now(conn: Connection) -> datetime:
    """The database's clock (the transaction's timestamp)."""
    return audit.database_now(conn)
