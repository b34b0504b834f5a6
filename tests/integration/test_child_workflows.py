"""Child workflows on the real services (docs/concepts.md "Child workflows"): a parent with a
child completes with the child's output; a child failing fails the parent's step; a parent
cancelled while three children run cancels all three (their agents told); pause and resume
cascade; a parent compensating after its child completed compensates the child in reverse
order, inside its own chain; the step made ready twice makes one child; the depth bound."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

from sasflow.children import child_key
from sasflow.ops import runs as run_ops
from sasflow.ops.cancel import cancel
from sasflow.ops.pause import pause_run, resume_run
from sasflow.ops.resubmit import resubmit
from sasflow.store.db import transaction
from sasflow.store.runs import children as store_children
from sasflow.store.runs.advance import advance_runs
from sasflow.store.schema import runs, steps
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import child_workflows as children

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _fresh_agent_records() -> Iterator[None]:
    children.reset()
    yield
    children.release.set()
    children.reset()


def _run(engine: Engine, run_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).one()


def _children(engine: Engine, run_id: int) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(select(runs).where(runs.c.parent_run_id == run_id).order_by(runs.c.id))
        )


def _step(engine: Engine, run_id: int, name: str, kind: str = "forward") -> Any:
    [row] = [r for r in harness.step_rows(engine, run_id) if r.name == name and r.kind == kind]
    return row


def _roles(engine: Engine, database_url: str, names: Names) -> Any:
    return harness.running(
        harness.scheduler(engine, database_url, children.registry, names),
        harness.agent(children.shop, names, concurrency=8),
    )


def pack_by_hand(engine: Engine, run_id: int, *, parent_run_id: int | None = None) -> None:
    """Step `pack` of an `order` run processed by hand, then the run advanced (its child step
    made ready); `parent_run_id`: the run is made a child of that run first."""
    with transaction(engine) as conn:
        if parent_run_id is not None:
            conn.execute(
                update(runs).where(runs.c.id == run_id).values(parent_run_id=parent_run_id)
            )
        conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.name == "pack")
            .values(state="processed", output={"parcel": f"p{run_id}"})
        )
        advance_runs(conn, children.registry, [run_id], actor="test")


def _ended(engine: Engine, run_id: int, states: set[str]) -> bool:
    return str(_run(engine, run_id).state) in states


def _run_to_end(
    engine: Engine,
    database_url: str,
    names: Names,
    workflow: str,
    run_input: Any,
    *,
    ends: set[str],
) -> int:
    """Submit a run of `workflow` and run the roles until it ends in one of `ends`."""
    run_id = harness.submit(
        engine,
        children.registry,
        names,
        workflow,
        key=f"{workflow}-{run_input}",
        run_input=run_input,
    )
    with _roles(engine, database_url, names):
        harness.wait_for(lambda: _ended(engine, run_id, ends), what=f"the run ends in {ends}")
    return run_id


def test_a_parent_completes_with_its_childs_output(
    engine: Engine, database_url: str, names: Names
) -> None:
    run_id = _run_to_end(
        engine, database_url, names, "order", {"order": 1}, ends={"completed", "error"}
    )

    assert _run(engine, run_id).state == "completed"
    [child] = _children(engine, run_id)
    assert (child.workflow, child.business_key, child.parent_step) == (
        "shipping",
        child_key(run_id, "ship"),
        "ship",
    )
    assert child.state == "completed"
    assert child.input == {"parcel": "parcel-1", "fail": False}
    ship = _step(engine, run_id, "ship")
    assert ship.state == "processed"
    assert ship.output == child.output == {"send": {"tracking": "track-parcel-1"}}
    assert ship.input["child"]["run_id"] == child.id
    # The run detail (`runs show`, `GET /v1/runs/{id}`, the console) links them both ways.
    with engine.connect() as conn:
        parent_detail = run_ops.show_run(conn, run_id)["run"]
        child_detail = run_ops.show_run(conn, child.id)["run"]
    assert parent_detail["children"] == [child.id]
    assert parent_detail["parent_run_id"] is None
    assert (child_detail["parent_run_id"], child_detail["parent_step"]) == (run_id, "ship")
    assert child_detail["children"] == []
    order = [(r, a) for r, a in children.calls]
    assert order == [
        (run_id, "pack"),
        (child.id, "label"),
        (child.id, "send"),
        (run_id, "charge"),
    ]


def test_a_child_failing_fails_the_parents_step(
    engine: Engine, database_url: str, names: Names
) -> None:
    run_input = {"order": 2, "fail_ship": True}
    run_id = _run_to_end(
        engine, database_url, names, "order_error", run_input, ends={"completed", "error"}
    )

    run = _run(engine, run_id)
    [child] = _children(engine, run_id)
    assert child.state == "error"
    assert run.state == "error"
    assert run.error["step"] == "ship"
    assert run.error["error"]["type"] == "ChildFailed"
    assert run.error["error"]["child_run_id"] == child.id
    assert run.error["error"]["child_error"]["error"]["message"] == (
        "the carrier refused the parcel"
    )


def test_a_parent_cancelled_while_three_children_run_cancels_all_three(
    engine: Engine, database_url: str, names: Names
) -> None:
    run_id = harness.submit(
        engine, children.registry, names, "fanout", key="f1", run_input={"order": 3}
    )
    with _roles(engine, database_url, names):
        harness.wait_for(lambda: len(children.holding) == 3, what="three holds running")
        kids = _children(engine, run_id)
        assert [k.parent_step for k in kids] == ["c1", "c2", "c3"]
        with transaction(engine) as conn:
            cancel(conn, run_id, actor="ann", reason="customer left", namespace=names.namespace)
        # Each child's agent is told (its Cancel), so every hold stops early.
        harness.wait_for(lambda: not children.holding, what="the holds stopped by their cancel")

    assert _run(engine, run_id).state == "cancelled"
    for kid in _children(engine, run_id):
        assert kid.state == "cancelled"
        assert kid.error["message"] == f"parent run {run_id} cancelled: customer left"
        assert _step(engine, kid.id, "hold").state == "cancelled"
        assert _step(engine, run_id, kid.parent_step).state == "cancelled"
    assert sorted(a for _, a in children.calls) == ["hold", "hold", "hold", "pack"]


def test_pausing_the_parent_pauses_its_children_and_resuming_resumes_them(
    engine: Engine, database_url: str, names: Names
) -> None:
    run_id = harness.submit(
        engine, children.registry, names, "fanout", key="f2", run_input={"order": 4}
    )
    with _roles(engine, database_url, names):
        harness.wait_for(lambda: len(children.holding) == 3, what="three holds running")
        with transaction(engine) as conn:
            pause_run(conn, run_id, actor="ann", reason="check stock")
        assert [k.paused for k in _children(engine, run_id)] == [True, True, True]
        with transaction(engine) as conn:
            resume_run(conn, run_id, actor="ann", reason="stock checked")
        assert [k.paused for k in _children(engine, run_id)] == [False, False, False]
        children.release.set()
        harness.wait_for(lambda: _ended(engine, run_id, {"completed", "error"}), what="the end")
    assert _run(engine, run_id).state == "completed"


def test_a_parent_compensating_after_its_child_completed_compensates_the_child_in_reverse(
    engine: Engine, database_url: str, names: Names
) -> None:
    run_id = _run_to_end(
        engine,
        database_url,
        names,
        "order",
        {"order": 5, "fail_charge": True},
        ends={"compensated", "compensation_failed", "error"},
    )

    assert _run(engine, run_id).state == "compensated"
    [child] = _children(engine, run_id)
    assert child.state == "compensated"
    assert child.error["type"] == "ParentCompensating"
    # One saga: the child's steps undone in reverse, then the parent's step before it.
    assert children.calls[-3:] == [
        (child.id, "unsend"),
        (child.id, "unlabel"),
        (run_id, "unpack"),
    ]
    undo = _step(engine, run_id, "ship", kind="compensation")
    assert undo.state == "processed"


def test_the_step_made_ready_twice_makes_one_child(engine: Engine, names: Names) -> None:
    run_id = harness.submit(
        engine, children.registry, names, "order", key="o4", run_input={"order": 6}
    )
    pack_by_hand(engine, run_id)
    first = _step(engine, run_id, "ship").input["child"]["run_id"]
    # Made ready again: its record put back to waiting without its child (a lost update).
    with transaction(engine) as conn:
        ship = _step(engine, run_id, "ship").id
        conn.execute(update(steps).where(steps.c.id == ship).values(input=None))
        advance_runs(conn, children.registry, [run_id], actor="test")
    assert [k.id for k in _children(engine, run_id)] == [first]
    assert _step(engine, run_id, "ship").input["child"]["run_id"] == first


def test_a_child_past_the_depth_bound_fails_its_step(
    engine: Engine, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_children, "MAX_DEPTH", 1)
    run_id = harness.submit(
        engine, children.registry, names, "order", key="o5", run_input={"order": 7}
    )
    # The run is itself a child, one deep: its own child would be two deep.
    pack_by_hand(engine, run_id, parent_run_id=run_id + 1000)
    ship = _step(engine, run_id, "ship")
    assert ship.state == "error"
    assert ship.error["type"] == "ChildDepthError"
    assert _run(engine, run_id).error["error"]["type"] == "ChildDepthError"
    assert _children(engine, run_id) == []
    assert _run(engine, run_id).state in {"compensating", "compensated"}


def test_a_resubmitted_parent_takes_its_child_as_the_child_ended(
    engine: Engine, database_url: str, names: Names
) -> None:
    """A parent resubmitted after its child failed fails its step again (resubmit the child
    first); once the child, resubmitted with a fixed input, completed, resubmitting the parent
    takes the child's output: still one child."""
    run_input = {"order": 8, "fail_ship": True}
    run_id = _run_to_end(
        engine, database_url, names, "order_error", run_input, ends={"completed", "error"}
    )
    [child] = _children(engine, run_id)

    def again(run: int, new_input: Any = None) -> None:
        with transaction(engine) as conn:
            resubmit(
                conn,
                children.registry,
                run,
                actor="ann",
                reason="carrier fixed",
                namespace=names.namespace,
                new_input=new_input,
            )

    with _roles(engine, database_url, names):
        again(run_id)
        harness.wait_for(
            lambda: (
                _step(engine, run_id, "ship").state == "error" and _ended(engine, run_id, {"error"})
            ),
            what="the parent failed again",
        )
        assert "resubmit it, then this run" in _run(engine, run_id).error["error"]["message"]
        again(child.id, {"parcel": "parcel-8", "fail": False})
        harness.wait_for(lambda: _ended(engine, child.id, {"completed"}), what="the child")
        again(run_id)
        harness.wait_for(lambda: _ended(engine, run_id, {"completed"}), what="the parent")

    assert [k.id for k in _children(engine, run_id)] == [child.id]
    assert _step(engine, run_id, "ship").output == {"send": {"tracking": "track-parcel-8"}}
