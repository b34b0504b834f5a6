"""Map steps (`Step.map`) as a run's rows say them, decided without I/O for `store.decide`.

When a map becomes ready its items are read from the run's data (`MapSpec.read`) and become
step records of their own (`name[index]`, `map_parent` the map's record, `map_index`,
`map_size`): the first `parallelism` pending, the others waiting, all inserted in the
transaction that made the map ready, so the claim takes them like any step. The map's own
record stays `waiting` while they run; its input says what it runs over (`{"map": {...}}`), so
the rows alone decide how it goes on, with or without the definition: waiting items are
released as others end (at most `parallelism` pending or processing), and once they are all
done the map is processed with their outputs in item order, or in error when one failed and it
does not continue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sasflow.commands import StoredError
from sasflow.maps import MapError, OnItemFailure, item_name
from sasflow.states import StepKind, StepState
from sasflow.store.runs.records import RunRecord, StepRecord
from sasflow.store.runs.step_rows import POLICY_COLUMNS, defined_columns, step_row
from sasflow.workflow import Step

MAP_KEY = "map"
"""The key of a map's input once its items exist."""

RUNNING_ITEM_STATES = frozenset({StepState.PENDING, StepState.PROCESSING})
"""The items that count against the map's parallelism."""
ENDED_ITEM_STATES = frozenset(
    {StepState.PROCESSED, StepState.SKIPPED, StepState.ERROR, StepState.CANCELLED}
)
"""The items a map no longer waits for."""
OPEN_ITEM_STATES = frozenset(StepState) - ENDED_ITEM_STATES
"""The items a map still waits for (running, waiting, parked)."""


@dataclass(frozen=True, slots=True)
class ExpandMap:
    """A map whose dependencies are done gets its item records (`items`, step_rows values);
    it stays waiting with `input` (what it runs over) until they are done."""

    step: StepRecord
    input: dict[str, Any]
    items: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class EndMap:
    """A waiting map ends: processed with its output (its items done, or none), or in error
    (an item failed and the map does not continue)."""

    step: StepRecord
    state: StepState
    output: Any = None
    error: StoredError | None = None
    at_once: bool = False
    """An empty map, processed as it became ready: its successors are decided next."""


def expanded(step: StepRecord) -> dict[str, Any] | None:
    """What a waiting map runs over once its items exist; None for any other record."""
    return running_over(step.state, step.input)


def running_over(state: StepState | str, input: Any) -> dict[str, Any] | None:  # noqa: A002
    """What a map record in `state` with `input` runs over once its items exist; None when it
    is not a waiting map whose items exist."""
    if state != StepState.WAITING or not isinstance(input, dict):
        return None
    spec = input.get(MAP_KEY)
    return spec if isinstance(spec, dict) else None


@dataclass(frozen=True, slots=True)
class ItemCounts:
    """A map's items as one indexed read counts them (store.runs.map_drain)."""

    running: int
    """Pending or processing: they hold the map's parallelism."""
    failed: bool
    """One ended in error."""
    open: bool
    """One is not ended yet (running, waiting or parked)."""


def to_release(spec: Mapping[str, Any], counts: ItemCounts) -> int | None:
    """After an item ended, how many waiting items the map releases (in index order), from its
    items' counts alone: what `progress` decides from all their rows while the map goes on.
    None: the map ends now (every item ended, or one failed and the map does not continue),
    which `progress` decides from all the rows (the outputs joined in order)."""
    policy = OnItemFailure(spec.get("on_item_failure", OnItemFailure.FAIL_FAST))
    if (counts.failed and policy != OnItemFailure.CONTINUE) or not counts.open:
        return None
    return max(int(spec.get("parallelism", 1)) - counts.running, 0)


def expand(
    run: RunRecord,
    step: StepRecord,
    definition: Step,
    parks: tuple[bool, bool],
    outputs: Mapping[str, Any],
) -> ExpandMap | EndMap | StoredError:
    """A ready map: its items, an empty map processed at once (`[]`), or why it fails."""
    spec = definition.map_spec
    assert spec is not None  # noqa: S101 - decide asks for maps only
    try:
        values = spec.read(run.input, outputs)
    except MapError as exc:
        return StoredError("MapError", f"map step {step.name!r}: {exc}")
    if not values:
        return EndMap(
            step, StepState.PROCESSED, output=_output(spec.on_item_failure, []), at_once=True
        )
    size = len(values)
    shared = defined_columns(
        name=step.name,
        kind=StepKind.FORWARD,
        agent=step.agent,
        action=definition.action,
        depends_on=(),
        policy={column: getattr(step, column) for column in POLICY_COLUMNS},
        compensate_action=definition.compensate,
        pool=step.pool,
        parks=parks,
    )
    items = tuple(
        step_row(shared, run_id=run.id, priority=step.priority, input=value, pool=step.pool)
        | {
            "name": item_name(step.name, index),
            "state": StepState.PENDING if index < spec.parallelism else StepState.WAITING,
            "map_parent": step.id,
            "map_index": index,
            "map_size": size,
        }
        for index, value in enumerate(values)
    )
    described = {
        "items": str(spec.items),
        "size": size,
        "parallelism": spec.parallelism,
        "on_item_failure": str(spec.on_item_failure),
    }
    return ExpandMap(step, {MAP_KEY: described}, items)


def progress(map_step: StepRecord, items: Sequence[StepRecord]) -> EndMap | list[StepRecord]:
    """How an expanded map goes on from its items' rows: it ends, or the waiting items to
    release (none: nothing moves)."""
    spec = expanded(map_step) or {}
    policy = OnItemFailure(spec.get("on_item_failure", OnItemFailure.FAIL_FAST))
    ordered = sorted(items, key=lambda s: s.map_index or 0)
    failed = [s for s in ordered if s.state == StepState.ERROR]
    if failed and policy != OnItemFailure.CONTINUE:
        first = failed[0]
        extra: dict[str, Any] = {"index": first.map_index, "item_error": first.error}
        if policy == OnItemFailure.COMPENSATE:
            extra["compensate"] = True
        message = (
            f"map step {map_step.name!r}: item {first.map_index} of {len(ordered)} failed: "
            f"{_describe(first.error)}"
        )
        return EndMap(map_step, StepState.ERROR, error=StoredError("MapItemError", message, extra))
    if all(s.state in ENDED_ITEM_STATES for s in ordered):
        return EndMap(map_step, StepState.PROCESSED, output=_output(policy, ordered))
    free = int(spec.get("parallelism", 1)) - sum(s.state in RUNNING_ITEM_STATES for s in ordered)
    return [s for s in ordered if s.state == StepState.WAITING][: max(free, 0)]


def _output(policy: OnItemFailure, items: Sequence[StepRecord]) -> Any:
    """The items' outputs in item order; with "continue", with the items that did not end
    processed (their indexes, and their errors)."""
    results = [s.output if s.state == StepState.PROCESSED else None for s in items]
    if policy != OnItemFailure.CONTINUE:
        return results
    missed = [s for s in items if s.state != StepState.PROCESSED]
    return {
        "results": results,
        "failed": [s.map_index for s in missed],
        "errors": [{"index": s.map_index, "state": s.state, "error": s.error} for s in missed],
    }


def _describe(error: Any) -> str:
    if isinstance(error, dict) and "message" in error:
        return f"{error.get('type', 'Error')}: {error['message']}"
    return repr(error)
