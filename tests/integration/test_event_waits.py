"""Event waits (`Step.wait_for`) in the store, on PostgreSQL: events are stored first and matched
both ways, exactly once (one event per wait, one completion per event id), and a wait past its
timeout applies its `on_timeout`; unmatched events expire."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update

from sasflow import Registry, Step, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.ops.runs import show_run
from sasflow.store.db import transaction
from sasflow.store.inbound import ingest, match
from sasflow.store.runs.advance import advance_runs
from sasflow.store.runs.claim import claim_steps
from sasflow.store.runs.events import record as record_events
from sasflow.store.schema import events, inbound_events, runs, steps
from sasflow.waits import Default
from tests import harness

pytestmark = pytest.mark.integration

NS = "t"


def _registry() -> Registry:
    agent = Agent("work")

    @agent.handler("do")
    def do(call: Call) -> dict[str, Any]:
        return {"step": call.step}

    def flow(name: str, on_timeout: Any, on_failure: Any = "error") -> Workflow:
        return Workflow(
            name,
            [
                Step("a", "work", "do"),
                Step.wait_for(
                    "paid",
                    event="payment_confirmed",
                    match="input.order_id",
                    timeout=3600,
                    on_timeout=on_timeout,
                ),
                Step("b", "work", "do"),
            ],
            on_failure=on_failure,
        )

    return Registry(
        [
            flow("order", "fail"),
            flow("order_compensate", "compensate"),
            flow("order_default", Default({"paid": False})),
        ],
        [agent],
    )


def _submit(engine: Engine, registry: Registry, order_id: Any, workflow: str = "order") -> int:
    with engine.begin() as conn:
        return submit_run(
            conn, registry, workflow, {"order_id": order_id}, key=str(order_id), namespace=NS
        ).run_id


def _open_wait(engine: Engine, registry: Registry, run_id: int) -> None:
    """Step `a` done: advancing the run opens the wait."""
    with transaction(engine) as conn:
        conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.name == "a")
            .values(state="processed", output={})
        )
        advanced = advance_runs(conn, registry, [run_id], actor="test")
        record_events(conn, advanced.events)  # as every caller of advance_runs does


def _send(engine: Engine, order_id: Any, event_id: str, payload: Any = None) -> ingest.Stored:
    event = ingest.InboundEvent.from_json(
        {"name": "payment_confirmed", "correlation": order_id, "id": event_id, "payload": payload}
    )
    with transaction(engine) as conn:
        return ingest.store_event(conn, event, source="api", namespace=NS, actor="test")


def _match(engine: Engine, registry: Registry) -> match.MatchReport:
    with transaction(engine) as conn:
        return match.match(conn, registry, batch=10, namespace=NS, actor="s1")


def _steps(engine: Engine, run_id: int) -> dict[str, Any]:
    return {r.name: r for r in harness.step_rows(engine, run_id)}


def _event_rows(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(inbound_events).order_by(inbound_events.c.id)))


def test_an_event_sent_before_the_wait_opens_is_consumed_when_it_opens(engine: Engine) -> None:
    """The wait takes its stored event in the transaction that opens it, and its successor is
    ready in the same transaction."""
    registry = _registry()
    run = _submit(engine, registry, 42)
    stored = _send(engine, 42, "evt-1", {"amount": 10})
    assert (stored.created, stored.step_id) == (True, None)
    _open_wait(engine, registry, run)
    by_name = _steps(engine, run)
    assert (by_name["paid"].state, by_name["paid"].output) == ("processed", {"amount": 10})
    assert by_name["b"].state == "pending"
    [row] = _event_rows(engine)
    assert row.consumed_step_id == by_name["paid"].id
    assert _match(engine, registry).completed == 0  # nothing left for the duty
    with engine.connect() as conn:
        detail = conn.execute(
            select(events.c.detail).where(events.c.run_id == run, events.c.reason == "event")
        ).scalar_one()
    assert detail == {"event": "payment_confirmed", "event_id": "evt-1", "correlation": "42"}


def test_an_open_wait_is_never_claimed_and_the_duty_matches_what_neither_side_saw(
    engine: Engine,
) -> None:
    """An event stored without matching though its wait is open (as when it raced the wait's
    opening) is matched by the duty's pass."""
    registry = _registry()
    run = _submit(engine, registry, 43)
    _open_wait(engine, registry, run)
    with transaction(engine) as conn:
        assert claim_steps(conn, locked_by="s1", batch=10) == []  # no agent takes a wait
        conn.execute(
            inbound_events.insert().values(
                name="payment_confirmed",
                event_id="raced",
                correlation="43",
                payload={"raced": True},
                source="api",
                expires_at=func.now() + timedelta(days=1),
            )
        )
    report = _match(engine, registry)
    by_name = _steps(engine, run)
    assert report.completed == 1
    assert (by_name["paid"].state, by_name["paid"].output) == ("processed", {"raced": True})
    assert by_name["b"].state == "pending"


def test_an_event_sent_after_the_wait_opened_completes_it_at_once(engine: Engine) -> None:
    registry = _registry()
    run = _submit(engine, registry, "A-7")
    _open_wait(engine, registry, run)
    stored = _send(engine, "A-7", "evt-1", {"ok": True})
    by_name = _steps(engine, run)
    assert (stored.created, stored.step_id, stored.run_id) == (True, by_name["paid"].id, run)
    assert (by_name["paid"].state, by_name["paid"].output) == ("processed", {"ok": True})
    # The ingress has no registry: a scheduler's advance duty makes `b` ready.
    assert by_name["b"].state == "waiting"
    with engine.connect() as conn:
        due = conn.execute(select(runs.c.advance_due).where(runs.c.id == run)).scalar_one()
    assert due is not None


def test_the_same_event_sent_twice_completes_the_wait_once(engine: Engine) -> None:
    registry = _registry()
    first, second = _submit(engine, registry, 1), _submit(engine, registry, "1b")
    _open_wait(engine, registry, first)
    once = _send(engine, 1, "evt-1", {"n": 1})
    # The same id again, even with another correlation that has an open wait: the same event.
    _open_wait(engine, registry, second)
    again = _send(engine, "1b", "evt-1", {"n": 2})
    assert (once.created, again.created) == (True, False)
    assert again.step_id == once.step_id == _steps(engine, first)["paid"].id
    assert _steps(engine, second)["paid"].state == "pending"
    assert len(_event_rows(engine)) == 1
    with engine.connect() as conn:
        completions = conn.execute(
            select(func.count()).where(events.c.reason == "event")
        ).scalar_one()
    assert completions == 1


def test_two_events_for_one_wait_racing_consume_one_and_the_other_stays_unmatched(
    engine: Engine,
) -> None:
    registry = _registry()
    run = _submit(engine, registry, 5)
    _open_wait(engine, registry, run)
    barrier = threading.Barrier(2)
    results: list[ingest.Stored] = []

    def send(event_id: str) -> None:
        barrier.wait()
        results.append(_send(engine, 5, event_id, {"id": event_id}))

    threads = [threading.Thread(target=send, args=(f"evt-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _match(engine, registry)  # what the duty does next: nothing left to match
    rows = _event_rows(engine)
    consumed = [r for r in rows if r.consumed_step_id is not None]
    assert (len(rows), len(consumed)) == (2, 1)
    paid = _steps(engine, run)["paid"]
    assert paid.output == consumed[0].payload
    assert sorted(r.step_id is not None for r in results) in ([False, True], [True, True])


def test_an_event_racing_the_wait_opening_is_matched_exactly_once(engine: Engine) -> None:
    """Whichever commits first, the event completes the wait once: at its storing, or at the
    duty's next pass."""
    registry = _registry()
    for i in range(5):
        run = _submit(engine, registry, f"race-{i}")
        barrier = threading.Barrier(2)

        def opener(run_id: int = run, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            _open_wait(engine, registry, run_id)

        def sender(i: int = i, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            _send(engine, f"race-{i}", f"evt-{i}", {"i": i})

        threads = [threading.Thread(target=opener), threading.Thread(target=sender)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _match(engine, registry)
        _match(engine, registry)
        assert _steps(engine, run)["paid"].output == {"i": i}
    with engine.connect() as conn:
        completions = conn.execute(
            select(func.count()).where(events.c.reason == "event")
        ).scalar_one()
    assert completions == 5


def _time_out(engine: Engine, registry: Registry, run_id: int) -> match.MatchReport:
    with transaction(engine) as conn:
        conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.name == "paid")
            .values(not_before=func.now() - timedelta(seconds=1))
        )
    with transaction(engine) as conn:  # due, and still no agent's to claim
        assert claim_steps(conn, locked_by="s1", batch=10) == []
    with transaction(engine) as conn:
        return match.time_out(conn, registry, batch=10, namespace=NS, actor="s1")


def _run_state(engine: Engine, run_id: int) -> str:
    with engine.connect() as conn:
        state: str = conn.execute(select(runs.c.state).where(runs.c.id == run_id)).scalar_one()
    return state


def test_a_wait_that_times_out_with_fail_fails_its_run(engine: Engine) -> None:
    registry = _registry()
    run = _submit(engine, registry, 9)
    _open_wait(engine, registry, run)
    assert _time_out(engine, registry, run).completed == 1
    paid = _steps(engine, run)["paid"]
    assert (paid.state, paid.error["type"]) == ("error", "EventTimeoutError")
    assert _run_state(engine, run) == "error"
    stored = _send(engine, 9, "late")  # a late event stays unmatched
    assert stored.step_id is None


def test_a_wait_that_times_out_with_compensate_compensates_its_run(engine: Engine) -> None:
    registry = _registry()
    run = _submit(engine, registry, 10, "order_compensate")
    _open_wait(engine, registry, run)
    _time_out(engine, registry, run)
    assert _steps(engine, run)["paid"].error["compensate"] is True
    assert _run_state(engine, run) in {"compensating", "compensated"}


def test_a_wait_that_times_out_with_a_default_completes_with_it(engine: Engine) -> None:
    registry = _registry()
    run = _submit(engine, registry, 11, "order_default")
    _open_wait(engine, registry, run)
    _time_out(engine, registry, run)
    by_name = _steps(engine, run)
    assert (by_name["paid"].state, by_name["paid"].output) == ("processed", {"paid": False})
    assert by_name["b"].state == "pending"
    assert _run_state(engine, run) in {"pending", "running"}


def test_a_wait_not_due_is_not_timed_out(engine: Engine) -> None:
    registry = _registry()
    run = _submit(engine, registry, 12)
    _open_wait(engine, registry, run)
    with transaction(engine) as conn:
        assert match.time_out(conn, registry, batch=10, namespace=NS, actor="s1").completed == 0
        shown = {s["name"]: s for s in show_run(conn, run)["steps"]}
    assert _steps(engine, run)["paid"].state == "pending"
    # What the console and `sasflow runs show` say it waits for.
    assert shown["paid"]["waiting"].startswith(
        "waiting for event payment_confirmed (correlation '12') until "
    )


def test_unmatched_events_are_listed_and_expire_after_their_retention(engine: Engine) -> None:
    registry = _registry()
    _send(engine, "nobody", "evt-old")
    _send(engine, "nobody", "evt-new")
    with transaction(engine) as conn:
        conn.execute(
            update(inbound_events)
            .where(inbound_events.c.event_id == "evt-old")
            .values(expires_at=func.now() - timedelta(seconds=1))
        )
    with transaction(engine) as conn:
        listed = ingest.list_events(conn, unmatched=True)
    assert [e["event_id"] for e in listed] == ["evt-new", "evt-old"]
    # An expired event is not matched even before it is deleted: the wait takes the other.
    run = _submit(engine, registry, "nobody")
    _open_wait(engine, registry, run)
    with transaction(engine) as conn:
        consumed = ingest.list_events(conn)
    assert [(e["event_id"], e["step_id"]) for e in consumed] == [
        ("evt-new", _steps(engine, run)["paid"].id),
        ("evt-old", None),
    ]
    with transaction(engine) as conn:
        assert match.expire(conn, batch=10) == 1
        assert ingest.list_events(conn, unmatched=True) == []
