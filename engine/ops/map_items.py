"""A run's map items grouped under their map, as the API (`GET /v1/runs/{id}`) and the console's
run page show them: a map of 10,000 items is one step with its counts by state and its first
items, not 10,000 rows (docs/api.md, docs/console.md).

No I/O: `group` takes what `inspect.run_detail(..., map_items=n)` read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sasflow.states import StepKind

DEFAULT_SHOWN = 20
"""How many items of each map a run's detail lists unless asked for more."""


def group(
    steps: Sequence[dict[str, Any]], counts: Mapping[int, Mapping[str, int]]
) -> list[dict[str, Any]]:
    """`steps` without the items of maps, each map's step given a `map` summary: what it runs
    over (`size`, `parallelism`, `on_item_failure`), its items' `counts` by state, the `items`
    listed (in index order) and how many are not (`more`). A map whose items do not exist yet
    (not started, or failed before) has `map` None, as every other step."""
    items: dict[int, list[dict[str, Any]]] = {}
    rest: list[dict[str, Any]] = []
    for step in steps:
        parent = step.get("map_parent")
        if parent is not None and step["kind"] == StepKind.FORWARD:
            items.setdefault(int(parent), []).append(step)
        else:
            rest.append(step)
    for step in rest:
        step["map"] = summary(step, counts.get(int(step["id"])), items.get(int(step["id"]), []))
    return rest


def summary(
    step: Mapping[str, Any], counts: Mapping[str, int] | None, items: Sequence[dict[str, Any]]
) -> dict[str, Any] | None:
    """A map step's `map` summary; None for a step that is not a map whose items exist."""
    spec = step.get("input")
    described = spec.get("map") if isinstance(spec, dict) else None
    if not isinstance(described, dict) or counts is None:
        return None
    listed = sorted(items, key=lambda s: int(s["map_index"]))
    size = sum(counts.values())
    return {
        "size": size,
        "parallelism": described.get("parallelism"),
        "on_item_failure": described.get("on_item_failure"),
        "counts": dict(sorted(counts.items())),
        "items": listed,
        "more": size - len(listed),
    }


def describe(counts: Mapping[str, int]) -> str:
    """A map's counts for people: `25 items: 20 processed, 5 processing` (most first)."""
    total = sum(counts.values())
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = ", ".join(f"{count} {state}" for state, count in ordered)
    return f"{total} item{'s' if total != 1 else ''}: {parts}"
