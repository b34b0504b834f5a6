"""The doors' vocabulary without I/O: the bound of a workflow, what a read of its backlog
says, how a batch is split under the bound, and the options' checks (docs/backpressure.md)."""

from __future__ import annotations

import pytest

from sasflow import BacklogFullError, DefinitionError, Step, Workflow
from sasflow.backpressure import (
    RETRY_AFTER_S,
    Room,
    SubmitterBackpressure,
    bound_of,
    split_batch,
)


def _workflow(max_backlog: int | None = None) -> Workflow:
    return Workflow("w", [Step("s", "a", "act")], max_backlog=max_backlog)


def test_the_workflows_own_bound_wins_and_zero_means_none() -> None:
    assert bound_of(_workflow(), 100) == 100
    assert bound_of(_workflow(5), 100) == 5
    assert bound_of(_workflow(0), 100) is None
    assert bound_of(_workflow(), 0) is None
    assert bound_of(_workflow(7), 0) == 7


@pytest.mark.parametrize("bad", [-1, 2.5, True, "10"])
def test_a_bad_max_backlog_is_a_definition_error(bad: object) -> None:
    with pytest.raises(DefinitionError, match="max_backlog"):
        _workflow(bad)  # type: ignore[arg-type]


def test_a_room_is_full_at_its_bound_and_tells_what_is_free() -> None:
    assert Room("w", 3, 5).free == 2
    assert not Room("w", 4, 5).full
    assert Room("w", 5, 5).full
    assert Room("w", 7, 5).free == 0
    unbounded = Room("w", 0, None)
    assert (unbounded.free, unbounded.full) == (None, False)
    assert Room("w", 4, 5).admitting(1).full


def test_a_refusal_names_the_workflow_the_backlog_and_the_bound() -> None:
    error = Room("orders", 5, 5).refusal()
    assert isinstance(error, BacklogFullError)
    assert (error.workflow, error.backlog, error.bound, error.retry_after) == (
        "orders",
        5,
        5,
        RETRY_AFTER_S,
    )
    assert str(error) == (
        "workflow 'orders' has 5 run(s) waiting to start, its bound is 5 (max_backlog): "
        f"submit again in {RETRY_AFTER_S}s"
    )
    with pytest.raises(ValueError, match="no bound"):
        Room("orders", 0, None).refusal()


def test_a_batch_is_admitted_in_arrival_order_up_to_the_room() -> None:
    split = split_batch(Room("w", 3, 5), ["a", "b", "c", "d"])
    assert (split.admitted, split.over) == (["a", "b"], ["c", "d"])
    assert split_batch(Room("w", 5, 5), ["a"]).over == ["a"]
    everything = split_batch(Room("w", 0, None), ["a", "b"])
    assert (everything.admitted, everything.over) == (["a", "b"], [])


def test_the_submitters_options_are_checked() -> None:
    assert SubmitterBackpressure().policy == "hold"
    with pytest.raises(ValueError, match="policy"):
        SubmitterBackpressure(policy="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_backlog"):
        SubmitterBackpressure(max_backlog=-1)
    with pytest.raises(ValueError, match="hold_s"):
        SubmitterBackpressure(hold_s=0)
