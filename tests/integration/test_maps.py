"""Map steps on the real services (docs/concepts.md "Map steps"): a map of 25 items with
parallelism 5 completes with its outputs in item order, each item run once, never more than 5
in flight, the handler told each item's index and the map's size; an item failing under each
policy (fail fast, continue, compensate); more items than `max_items`; an empty list."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow.commands import NewRun
from sasflow.ops.resubmit import resubmit
from sasflow.store.db import transaction
from sasflow.store.runs.submit import submit
from sasflow.store.schema import events, runs
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import maps

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _fresh_agent_records() -> Iterator[None]:
    maps.reset()
    yield
    maps.reset()


def _submit(engine: Engine, names: Names, workflow: str, lines: Sequence[Any]) -> int:
    with transaction(engine) as conn:
        return submit(
            conn,
            maps.registry,
            NewRun(workflow=workflow, key=f"{workflow}-{len(lines)}", input={"lines": lines}),
            namespace=names.namespace,
            actor="test",
        ).run_id


def _run_all(engine: Engine, database_url: str, names: Names, ends: set[str], count: int) -> None:
    with harness.running(
        harness.scheduler(engine, database_url, maps.registry, names),
        harness.agent(maps.stock, names, concurrency=8),
    ):
        harness.wait_for(
            harness.all_runs_in(engine, ends, count), timeout=90, what=f"runs end in {ends}"
        )


def _run_row(engine: Engine, run_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).one()


def _steps(engine: Engine, run_id: int) -> dict[str, Any]:
    return {r.name: r for r in harness.step_rows(engine, run_id) if r.kind == "forward"}


def _most_in_flight(engine: Engine, run_id: int) -> int:
    """The most items claimed and not yet ended at once, from the run's history (events in
    id order: an item is released in the transaction that ends another, and claimed after)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(events.c.step, events.c.from_state, events.c.to_state)
            .where(events.c.run_id == run_id, events.c.entity == "step")
            .order_by(events.c.id)
        ).all()
    in_flight, most = 0, 0
    for step, from_state, to_state in rows:
        if not step.startswith("reserve["):
            continue
        if to_state == "processing":
            in_flight += 1
        elif from_state == "processing":
            in_flight -= 1
        most = max(most, in_flight)
    return most


def test_a_map_of_25_items_runs_each_once_in_order_within_its_parallelism(
    engine: Engine, database_url: str, names: Names
) -> None:
    lines = [{"sku": f"sku-{i}"} for i in range(25)]
    run_id = _submit(engine, names, "orders", lines)
    _run_all(engine, database_url, names, {"completed"}, 1)

    expected = [{"sku": f"sku-{i}", "index": i} for i in range(25)]
    assert _run_row(engine, run_id).output == {"ship": {"reserved": expected}}
    steps = _steps(engine, run_id)
    assert steps["reserve"].state == "processed"
    assert steps["reserve"].output == expected
    items = [steps[f"reserve[{i}]"] for i in range(25)]
    assert [(s.state, s.attempt, s.map_index, s.map_size) for s in items] == [
        ("processed", 1, i, 25) for i in range(25)
    ]
    assert len({s.idempotency_key for s in items}) == 25
    # Each item exactly once, and its handler told its index and the map's size.
    assert sorted((m, n, line) for _, m, n, line in maps.seen) == sorted(
        (i, 25, line) for i, line in enumerate(lines)
    )
    assert _most_in_flight(engine, run_id) == 5
    assert maps.most_at_once() <= 5


def test_fail_fast_fails_the_map_at_the_first_item_that_fails(
    engine: Engine, database_url: str, names: Names
) -> None:
    lines = [{"sku": "a"}, {"sku": "b", "fail": True}] + [{"sku": f"c{i}"} for i in range(10)]
    run_id = _submit(engine, names, "orders", lines)
    _run_all(engine, database_url, names, {"error"}, 1)

    run = _run_row(engine, run_id)
    assert run.error["step"] == "reserve"
    assert run.error["error"]["type"] == "MapItemError"
    assert run.error["error"]["index"] == 1
    assert "line 1 is out of stock" in run.error["error"]["message"]
    steps = _steps(engine, run_id)
    assert steps["reserve"].state == "error"
    assert steps["ship"].state == "skipped"
    items = [steps[f"reserve[{i}]"] for i in range(12)]
    assert items[1].state == "error"
    skipped = [s for s in items if s.state == "skipped"]
    assert skipped  # the items not started when item 1 failed never run
    assert all(s.attempt == 0 for s in skipped)
    assert {s.state for s in items} <= {"processed", "error", "skipped"}
    assert len(maps.seen) == 12 - len(skipped)


def test_continue_runs_every_item_and_reports_the_failed_ones(
    engine: Engine, database_url: str, names: Names
) -> None:
    lines = [{"sku": "a"}, {"sku": "b"}, {"sku": "c", "fail": True}, {"sku": "d"}]
    run_id = _submit(engine, names, "orders_continue", lines)
    _run_all(engine, database_url, names, {"completed"}, 1)

    shipped = _run_row(engine, run_id).output["ship"]["reserved"]
    assert shipped["results"] == [
        {"sku": "a", "index": 0},
        {"sku": "b", "index": 1},
        None,
        {"sku": "d", "index": 3},
    ]
    assert shipped["failed"] == [2]
    [failure] = shipped["errors"]
    assert (failure["index"], failure["state"]) == (2, "error")
    assert "line 2 is out of stock" in failure["error"]["message"]
    assert len(maps.seen) == 4


def test_compensate_undoes_the_items_done_in_reverse_index_order(
    engine: Engine, database_url: str, names: Names
) -> None:
    # Parallelism 5 over 4 lines: the items run together, so which ended first is not known;
    # every item that ended processed is undone, highest index first.
    lines = [{"sku": "a"}, {"sku": "b"}, {"sku": "c", "fail": True}, {"sku": "d"}]
    run_id = _submit(engine, names, "orders_compensate", lines)
    _run_all(engine, database_url, names, {"compensated"}, 1)

    steps = _steps(engine, run_id)
    assert steps["reserve"].state == "error"
    done = [i for i in range(4) if steps[f"reserve[{i}]"].state == "processed"]
    assert done == [0, 1, 3]  # all started together (parallelism 5): all but the failed end
    assert [index for rid, index in maps.released if rid == run_id] == [3, 1, 0]
    assert _run_row(engine, run_id).error["error"]["compensate"] is True


def test_more_items_than_max_items_fail_the_map_and_an_empty_list_completes_it(
    engine: Engine, database_url: str, names: Names
) -> None:
    too_many = _submit(engine, names, "orders", [{"sku": str(i)} for i in range(31)])
    empty = _submit(engine, names, "orders", [])
    _run_all(engine, database_url, names, {"completed", "error"}, 2)

    failed = _run_row(engine, too_many)
    assert failed.state == "error"
    assert failed.error["error"]["type"] == "MapError"
    assert "has 31 items, more than max_items=30" in failed.error["error"]["message"]
    assert set(_steps(engine, too_many)) == {"load", "reserve", "ship"}  # no item created

    completed = _run_row(engine, empty)
    assert completed.state == "completed"
    assert completed.output == {"ship": {"reserved": []}}
    assert maps.seen == []


def test_a_resubmitted_map_runs_over_its_list_again(
    engine: Engine, database_url: str, names: Names
) -> None:
    lines = [{"sku": "a"}, {"sku": "b", "fail": True}, {"sku": "c"}]
    run_id = _submit(engine, names, "orders", lines)
    _run_all(engine, database_url, names, {"error"}, 1)
    with transaction(engine) as conn:
        resubmit(
            conn,
            maps.registry,
            run_id,
            actor="test",
            reason="stock fixed",
            namespace=names.namespace,
            from_step="load",  # load reads the corrected input again
            new_input={"lines": [{"sku": "a"}, {"sku": "b"}, {"sku": "c"}]},
        )
    # Never pending: an agent would take the map's own record for an item.
    assert _steps(engine, run_id)["reserve"].state == "waiting"
    _run_all(engine, database_url, names, {"completed"}, 1)

    expected = [{"sku": s, "index": i} for i, s in enumerate("abc")]
    assert _run_row(engine, run_id).output == {"ship": {"reserved": expected}}
    items = [_steps(engine, run_id)[f"reserve[{i}]"] for i in range(3)]
    assert [(s.state, s.attempt) for s in items] == [("processed", 1)] * 3
