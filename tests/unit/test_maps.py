"""Map steps: their definition (`Step.map`: paths, bounds, where they may stand, the
fingerprint) and how a run with one advances, decided from its rows (store.decide,
store.runs.mapping): items created under the parallelism, released as others end, the outputs
joined in order, and each item-failure policy."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from sasflow.commands import StoredError
from sasflow.errors import DefinitionError
from sasflow.maps import item_name
from sasflow.states import OnFailure, StepState
from sasflow.store.runs.compensation import chain
from sasflow.store.runs.decide import (
    FailWaiting,
    Finish,
    MakeReady,
    NeedsAdvance,
    Release,
    Skip,
    StartCompensation,
    decide,
)
from sasflow.store.runs.mapping import (
    OPEN_ITEM_STATES,
    RUNNING_ITEM_STATES,
    EndMap,
    ExpandMap,
    ItemCounts,
    progress,
    to_release,
)
from sasflow.store.runs.records import StepRecord
from sasflow.workflow import Step, Workflow
from tests.unit.test_decide import _run, _step

BOOM = StoredError("Boom", "no").to_json()
P, R, W = StepState.PENDING, StepState.PROCESSING, StepState.WAITING
D, E = StepState.PROCESSED, StepState.ERROR


def _order(**options: Any) -> Workflow:
    """load -> reserve (a map over load's lines) -> ship."""
    return Workflow(
        "order",
        [
            Step("load", "svc", "go"),
            Step.map(
                "reserve",
                agent="stock",
                action="reserve",
                items="steps.load.lines",
                compensate="release",
                **options,
            ),
            Step("ship", "svc", "go"),
        ],
    )


def _before(lines: Any) -> list[StepRecord]:
    return [
        _step("load", StepState.PROCESSED, output={"lines": lines}),
        _step("reserve", StepState.WAITING, "load"),
        _step("ship", StepState.WAITING, "reserve"),
    ]


def _expanded(
    size: int, states: list[StepState], *, policy: str = "fail_fast", parallelism: int = 2
) -> list[StepRecord]:
    """The rows once the map's items exist: item i in states[i] (output i * 10 when
    processed, BOOM when in error)."""
    load, reserve, ship = _before(list(range(size)))
    spec = {"items": "steps.load.lines", "size": size, "parallelism": parallelism}
    reserve = dataclasses.replace(reserve, input={"map": spec | {"on_item_failure": policy}})
    items = [
        dataclasses.replace(
            _step(item_name("reserve", i), state, compensate="release"),
            map_parent=reserve.id,
            map_index=i,
            map_size=size,
            output=i * 10 if state == StepState.PROCESSED else None,
            error=BOOM if state == StepState.ERROR else None,
        )
        for i, state in enumerate(states)
    ]
    # The store reads them in no particular order.
    return [load, *reversed(items), reserve, ship]


# -- the definition -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"items": "lines"}, "items 'lines' must be"),
        ({"items": "steps.load"}, "must be"),
        ({"max_items": 0}, "max_items must be an integer between 1 and 100000"),
        ({"max_items": 100_001}, "max_items must be"),
        ({"parallelism": 0}, "parallelism must be an integer >= 1"),
        ({"parallelism": True}, "parallelism must be"),
        ({"on_item_failure": "retry"}, "on_item_failure must be"),
    ],
)
def test_a_map_with_a_bad_option_is_refused(options: dict[str, Any], message: str) -> None:
    given = {"agent": "stock", "action": "reserve", "items": "input.lines"} | options
    with pytest.raises(DefinitionError, match=message):
        Step.map("reserve", **given)


def test_a_map_reads_the_input_or_a_step_it_depends_on_and_is_not_a_root() -> None:
    with pytest.raises(DefinitionError, match="cannot be a root step"):
        Workflow("w", [Step.map("m", agent="a", action="b", items="input.lines")])
    with pytest.raises(DefinitionError, match="'other' is not a step it depends on"):
        Workflow(
            "w",
            [
                Step("load", "a", "b"),
                Step("other", "a", "b", after=()),
                Step.map("m", agent="a", action="b", items="steps.other.lines", after=("load",)),
            ],
        )
    with pytest.raises(DefinitionError, match="too long for the names of its items"):
        Step.map("m" * 97, agent="a", action="b", items="input.lines", max_items=1000)
    Workflow("w", [Step("load", "a", "b"), Step.map("m", agent="a", action="b", items="input.x")])


def test_the_fingerprint_covers_the_map_declaration() -> None:
    base = _order().fingerprint
    assert _order(parallelism=3).fingerprint != base
    assert _order(max_items=5).fingerprint != base
    assert _order(on_item_failure="continue").fingerprint != base
    assert _order().fingerprint == base


# -- decided from the rows ----------------------------------------------------------------


def test_a_ready_map_creates_its_items_the_first_parallelism_pending() -> None:
    steps = _before(["a", "b", "c"])
    decided = decide(_run(), steps, _order(parallelism=2))
    assert len(decided) == 1
    expand = decided[0]
    assert isinstance(expand, ExpandMap)
    assert expand.step.name == "reserve"
    assert expand.input["map"]["size"] == 3
    rows = expand.items
    assert [r["name"] for r in rows] == ["reserve[0]", "reserve[1]", "reserve[2]"]
    assert [r["input"] for r in rows] == ["a", "b", "c"]
    assert [r["state"] for r in rows] == [StepState.PENDING, StepState.PENDING, StepState.WAITING]
    assert {(r["map_parent"], r["map_size"], r["agent"], r["action"]) for r in rows} == {
        (steps[1].id, 3, "svc", "reserve")
    }
    assert [r["map_index"] for r in rows] == [0, 1, 2]
    assert len({r["idempotency_key"] for r in rows}) == 3
    assert {r["compensate_action"] for r in rows} == {"release"}


@pytest.mark.parametrize(
    ("lines", "max_items", "message"),
    [
        ({"a": 1}, 10, "steps.load.lines is a dict, not a list"),
        (None, 10, "steps.load.lines is a NoneType, not a list"),
        (list(range(11)), 10, "has 11 items, more than max_items=10"),
    ],
)
def test_no_list_within_bounds_fails_the_map_with_no_items(
    lines: Any, max_items: int, message: str
) -> None:
    decided = decide(_run(), _before(lines), _order(max_items=max_items))
    assert isinstance(decided[0], FailWaiting)
    assert decided[0].error.type == "MapError"
    assert message in decided[0].error.message
    assert not any(isinstance(d, ExpandMap) for d in decided)
    assert isinstance(decided[-2], Finish)


def test_a_missing_path_fails_the_map() -> None:
    steps = _before([])
    steps[0] = dataclasses.replace(steps[0], output={})
    decided = decide(_run(), steps, _order())
    assert isinstance(decided[0], FailWaiting)
    assert "steps.load.lines has no value" in decided[0].error.message


def test_an_empty_list_completes_the_map_at_once() -> None:
    decided = decide(_run(), _before([]), _order())
    assert len(decided) == 1
    assert isinstance(decided[0], EndMap)
    assert (decided[0].state, decided[0].output, decided[0].at_once) == (
        StepState.PROCESSED,
        [],
        True,
    )
    continued = decide(_run(), _before([]), _order(on_item_failure="continue"))
    assert isinstance(continued[0], EndMap)
    assert continued[0].output == {"results": [], "failed": [], "errors": []}


def test_items_ending_release_the_waiting_ones_in_index_order() -> None:
    decided = decide(_run(), _expanded(5, [D, R, W, W, W], parallelism=3), _order())
    assert all(isinstance(d, Release) for d in decided)
    assert [(d.step.name, d.reason) for d in decided if isinstance(d, Release)] == [
        ("reserve[2]", "map"),
        ("reserve[3]", "map"),
    ]
    assert decide(_run(), _expanded(4, [P, R, W, W], parallelism=2), _order()) == []


def test_the_map_ends_with_the_outputs_in_item_order_and_its_successor_follows() -> None:
    decided = decide(_run(), _expanded(3, [D, D, D]), _order())
    end, ready = decided
    assert isinstance(end, EndMap)
    assert (end.step.name, end.state, end.output) == ("reserve", D, [0, 10, 20])
    assert isinstance(ready, MakeReady)
    assert ready.step.name == "ship"


def test_fail_fast_fails_the_map_and_skips_the_items_not_started() -> None:
    decided = decide(_run(), _expanded(4, [D, E, R, W]), _order())
    end = decided[0]
    assert isinstance(end, EndMap)
    assert end.state == StepState.ERROR
    assert end.error is not None
    assert end.error.type == "MapItemError"
    assert "item 1 of 4 failed: Boom: no" in end.error.message
    assert "compensate" not in end.error.extra
    skipped = {d.step.name for d in decided if isinstance(d, Skip)}
    assert skipped == {"reserve[3]", "ship"}  # reserve[2] is in flight: it finishes
    finish = next(d for d in decided if isinstance(d, Finish))
    assert finish.state == "error"
    assert finish.error is not None
    assert finish.error.step == "reserve"


def test_continue_runs_every_item_and_reports_the_failed_ones() -> None:
    running = decide(_run(), _expanded(3, [E, R, D], policy="continue"), _order())
    assert running == []
    decided = decide(_run(), _expanded(3, [E, D, D], policy="continue"), _order())
    end = decided[0]
    assert isinstance(end, EndMap)
    assert end.state == D
    assert end.output == {
        "results": [None, 10, 20],
        "failed": [0],
        "errors": [{"index": 0, "state": "error", "error": BOOM}],
    }
    assert isinstance(decided[1], MakeReady)


def test_compensate_fails_the_map_and_the_run_compensates_whatever_its_policy() -> None:
    decided = decide(
        _run(on_failure=OnFailure.ERROR), _expanded(3, [D, E, D], policy="compensate"), _order()
    )
    end = decided[0]
    assert isinstance(end, EndMap)
    assert end.error is not None
    assert end.error.extra["compensate"] is True
    assert isinstance(decided[-1], StartCompensation)


def test_done_items_are_compensated_in_reverse_index_order_between_their_neighbours() -> None:
    steps = _expanded(3, [D, D, D])
    load, reserve, ship = (
        next(s for s in steps if s.name == n) for n in ("load", "reserve", "ship")
    )
    records = [
        dataclasses.replace(load, compensate_action="unload"),
        *[s for s in steps if s.map_parent is not None],
        dataclasses.replace(reserve, state=D),  # its own record has no compensation
        dataclasses.replace(ship, state=D, compensate_action="unship"),
    ]
    names = [r["name"] for r in chain(7, records)]
    assert names == ["ship", "reserve[2]", "reserve[1]", "reserve[0]", "load"]


def test_without_the_definition_the_rows_alone_release_and_end_the_map() -> None:
    # The supervisor and operators have no registry: an item they ended still moves the map.
    released = decide(_run(), _expanded(3, [E, W, W], policy="continue", parallelism=1), None)
    assert [(d.step.name, d.reason) for d in released if isinstance(d, Release)] == [
        ("reserve[1]", "map")
    ]
    ended = decide(_run(), _expanded(2, [D, D]), None)
    assert isinstance(ended[0], EndMap)
    assert ended[0].output == [0, 10]
    assert len(ended) == 2  # and a scheduler makes its successor ready
    assert ended[1] == NeedsAdvance("no registry")


# -- ending an item without reading the run (store.runs.map_drain) --------------------------


@pytest.mark.parametrize("policy", ["fail_fast", "continue", "compensate"])
@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_the_counts_release_what_the_rows_release(policy: str, parallelism: int) -> None:
    """For every state of 4 items, what the counts decide (`to_release`) is what the rows
    decide (`progress`): as many waiting items released, or the map ends (None)."""
    rows = _expanded(4, [W] * 4, policy=policy, parallelism=parallelism)
    map_step = next(s for s in rows if s.name == "reserve")
    waiting = sorted((s for s in rows if s.map_parent is not None), key=lambda s: s.id)
    for states in itertools.product(list(StepState), repeat=4):
        items = [dataclasses.replace(s, state=st) for s, st in zip(waiting, states, strict=True)]
        counts = ItemCounts(
            running=sum(s in RUNNING_ITEM_STATES for s in states),
            failed=StepState.ERROR in states,
            open=any(s in OPEN_ITEM_STATES for s in states),
        )
        expected = progress(map_step, items)
        found = to_release(map_step.input["map"], counts)
        if isinstance(expected, EndMap):
            assert found is None, states
        else:
            assert found is not None, states
            assert min(found, states.count(StepState.WAITING)) == len(expected), states
