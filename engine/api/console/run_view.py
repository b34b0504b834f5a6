"""What the run page and the runs list show, read once for a page and again for each live
update (console/live.py): the run with its steps, picture, timeline bars and the forms it
offers; the runs list's page."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sasflow.api.console import dag, timeline
from sasflow.api.console.views import PAGE, RunQuery, act
from sasflow.api.context import ApiContext
from sasflow.errors import SasflowError
from sasflow.ops import approvals as approval_ops
from sasflow.ops import runs as run_ops
from sasflow.ops.map_items import DEFAULT_SHOWN, describe
from sasflow.states import (
    CANCELLABLE_RUN_STATES,
    RESUBMITTABLE_RUN_STATES,
    TERMINAL_RUN_STATES,
    RunState,
    StepKind,
)
from sasflow.store.db import Connection


@dataclass(frozen=True)
class Typed:
    """A form as the user posted it, shown again with the errors next to its fields."""

    form: str
    """Which form: "resubmit", "cancel"."""
    values: Mapping[str, Any] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)
    status: int = 400
    """The answer's status (the refusal's)."""


def run_values(
    ctx: ApiContext, run_id: int, typed: Typed | None = None, *, map_items: int = DEFAULT_SHOWN
) -> dict[str, Any]:
    """The run page's values (a 404 page for an unknown run); the first `map_items` items of
    each map listed under it."""

    def read(conn: Connection) -> tuple[dict[str, Any], Any, list[dict[str, Any]]]:
        detail = run_ops.show_run(conn, run_id, map_items=map_items)
        return detail, run_ops.database_now(conn), approval_ops.list_open(conn, run_id=run_id)

    detail, db_now, approvals = act(ctx, read)
    run = detail["run"]
    forward = [s for s in detail["steps"] if s["kind"] == StepKind.FORWARD]
    try:
        workflow = ctx.registry.workflow(run["workflow"], run["version"])
    except SasflowError:
        picture = None  # this server's app does not know the workflow: the table still shows
    else:
        states = {s["name"]: str(s["state"]) for s in forward}
        picture = dag.layout(
            workflow.order, workflow.dependencies, states, decorations(run["id"], forward)
        )
    return {
        "run": run,
        "steps": detail["steps"],
        "forward": forward,
        "events": detail["events"],
        "failures": detail["failures"],
        "picture": picture,
        "box": dag,
        "bars": timeline.bars(run, with_items(detail["steps"]), detail["events"], db_now),
        "map_items": map_items,
        "describe_map": describe,
        "duration": timeline.duration,
        # The forms shown; the service functions still decide (a 409 page otherwise).
        "can_cancel": run["state"] in CANCELLABLE_RUN_STATES,
        "can_pause": run["state"] not in TERMINAL_RUN_STATES or bool(run.get("paused")),
        "can_unpark": bool(run.get("parked")),
        "approvals": approvals,
        "can_resubmit": run["state"] in RESUBMITTABLE_RUN_STATES
        or run["state"] == RunState.COMPLETED,
        "resubmit_choices": resubmit_choices(run["state"], forward),
        "typed": typed,
    }


def decorations(run_id: int, forward: list[dict[str, Any]]) -> dict[str, dag.Decoration]:
    """What the picture's boxes show besides name and state: a map's items by state, linked
    to its items' list."""
    found: dict[str, dag.Decoration] = {}
    for step in forward:
        if step.get("map"):
            counts = step["map"]["counts"]
            found[step["name"]] = dag.Decoration(
                lines=map_lines(counts),
                href=f"/ui/runs/{run_id}#map-{step['name']}",
                title=describe(counts),
            )
    return found


def map_lines(counts: Mapping[str, int]) -> tuple[str, ...]:
    """A map's box: how many items, then each state's count (most first), two per line."""
    total = sum(counts.values())
    ordered = [
        f"{n} {state}" for state, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    return (f"{total} items", *(", ".join(ordered[i : i + 2]) for i in range(0, len(ordered), 2)))


def with_items(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps, each map's listed items after it (the timeline draws them too)."""
    found: list[dict[str, Any]] = []
    for step in steps:
        found.append(step)
        if step.get("map"):
            found += step["map"]["items"]
    return found


def resubmit_choices(state: str, forward: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The resubmit form's `from_step` options, the default first, each one the service
    function accepts for a run in `state`: a completed run has no failed step (only "from
    step X" works), a run whose compensation failed only retries the compensation."""
    if state == RunState.COMPENSATION_FAILED:
        return [("", "its compensation (retried)")]
    steps = [(str(s["name"]), f"step {s['name']} and after") for s in forward]
    if state == RunState.COMPLETED:
        return steps
    return [("", "its failed steps"), *steps]


def runs_values(ctx: ApiContext, query: RunQuery, cursor: int | None) -> dict[str, Any]:
    """The runs list's page: the runs the filter matches, newest first, and the next cursor."""
    where = query.to_filter(PAGE)
    page, next_cursor = ctx.transaction(lambda conn: run_ops.runs_page(conn, where, cursor=cursor))
    return {"runs": page, "next_cursor": next_cursor, "query": query, "cursor": cursor}
