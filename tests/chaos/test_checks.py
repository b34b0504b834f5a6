"""The chaos checker itself: it passes a consistent history and flags each kind of violation.

A chaos run that never fails proves nothing unless its checker can fail; these tests build
a small completed history in a real state store, then break one thing at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import pytest
from sqlalchemy import Engine, select, update

from sasflow import submit_run
from sasflow.store.schema import events, runs, steps
from sasflow.transport.topology import REASON_HEADER
from tests.chaos import app
from tests.chaos.broker import DeadLetter
from tests.chaos.checks import Observed, check
from tests.chaos.faults import Fault, Injected
from tests.chaos.fleet import Exit, Slot
from tests.chaos.remote import Ledger, RemoteCall
from tests.chaos.sessions import LIMITED_ACTION, SessionLedger
from tests.chaos.workload import POISON_HEADER, STALE_MARK, Poison, Submissions

pytestmark = pytest.mark.integration

KEYS = ["k1", "k2", "k3"]


def _complete_history(engine: Engine) -> Observed:
    """Three runs fully processed at attempt 1, and what the harness would have seen: their
    charges of one account one after the other (each session opened when the last closed)."""
    ledger = Ledger()
    clock = [10.0]
    sessions = SessionLedger(clock=lambda: clock[0])
    with engine.begin() as conn:
        for key in KEYS:
            submit_run(conn, app.registry, app.order.name, {"work": 0}, key=key, namespace="t")
        for row in conn.execute(
            select(steps.c.id, steps.c.run_id, steps.c.name, steps.c.idempotency_key)
        ).all():
            request = {
                "key": row.idempotency_key,
                "step_id": row.id,
                "run_id": row.run_id,
                "step": row.name,
                "attempt": 1,
                "pid": 1,
            }
            if row.name == LIMITED_ACTION:
                session = {**request, "session": f"s{row.id}", "account": "acct-1"}
                sessions.open({**session, "budget": 4.0})
                clock[0] += 0.5
                effect = sessions.close(session["session"], partial(ledger.apply, request))
            else:
                effect = ledger.apply(request)
            conn.execute(
                update(steps)
                .where(steps.c.id == row.id)
                .values(
                    state="processed",
                    attempt=1,
                    output={
                        "effect": effect["effect"],
                        "attempt": 1,
                        "key": row.idempotency_key,
                        "step": row.name,
                    },
                )
            )
            conn.execute(
                events.insert().values(
                    run_id=row.run_id,
                    step_id=row.id,
                    entity="step",
                    step=row.name,
                    from_state="processing",
                    to_state="processed",
                    attempt=1,
                    actor="test",
                )
            )
        conn.execute(update(runs).values(state="completed"))
    calls, effects = ledger.snapshot()
    seen_sessions, late = sessions.snapshot()
    poison = Poison("p-0", "ns.submit", "malformed")
    now = time.time()
    return Observed(
        submissions=Submissions(keys=list(KEYS)),
        calls=calls,
        effects=effects,
        slots=[Slot("agent-1", ["x"], starts=2, exits=[Exit(now, -9, expected=True)])],
        poison=[poison],
        dead=[DeadLetter({POISON_HEADER: "p-0", REASON_HEADER: "Submission: bad"}, b"{")],
        stale_sent=1,
        past_deadline_max=0,
        past_deadline_final=0,
        injected=[
            Injected(
                Fault(1.0, "kill_agent", "agent-1", 1.0),
                now - 2,
                now - 1,
                True,
                recovery=1.5,
                settled=1.2,
            )
        ],
        healed=True,
        heal_seconds=1.0,
        fault_errors=[],
        sessions=seen_sessions,
        late_effects=late,
    )


def _first_step(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(steps.c.id).order_by(steps.c.id)).scalars().first() or 0)


def test_a_consistent_history_passes(engine: Engine) -> None:
    report = check(engine, _complete_history(engine))
    assert report.violations == [], report.text()
    assert "kill_agent" in report.text()
    assert report.figures["sessions"] == len(KEYS)
    assert report.figures["most_at_once"] == 1


def _lost_run(engine: Engine, seen: Observed) -> Observed:
    return replace(seen, submissions=Submissions(keys=[*KEYS, "never-recorded"]))


def _double_effect(engine: Engine, seen: Observed) -> Observed:
    step_id = _first_step(engine)
    extra = RemoteCall("another-key", step_id, 1, "reserve", 2, 1, time.time(), False)
    return replace(
        seen, calls=[*seen.calls, extra], effects={**seen.effects, "another-key": {"effect": 99}}
    )


def _stale_accepted(engine: Engine, seen: Observed) -> Observed:
    with engine.begin() as conn:
        conn.execute(
            update(steps)
            .where(steps.c.id == _first_step(engine))
            .values(output={"mark": STALE_MARK, "attempt": 1})
        )
    return seen


def _older_attempt(engine: Engine, seen: Observed) -> Observed:
    with engine.begin() as conn:
        conn.execute(update(steps).where(steps.c.id == _first_step(engine)).values(attempt=2))
    return seen


def _unfinished(engine: Engine, seen: Observed) -> Observed:
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.business_key == "k2").values(state="running"))
    return seen


def _crash_loop(engine: Engine, seen: Observed) -> Observed:
    now = time.time()
    looping = Slot(
        "scheduler-1", ["x"], starts=5, exits=[Exit(now + i, 1, expected=False) for i in range(4)]
    )
    return replace(seen, slots=[*seen.slots, looping])


def _poison_lost(engine: Engine, seen: Observed) -> Observed:
    return replace(seen, poison=[*seen.poison, Poison("p-1", "ns.replies", "malformed")])


def _poison_without_reason(engine: Engine, seen: Observed) -> Observed:
    return replace(seen, dead=[DeadLetter({POISON_HEADER: "p-0"}, b"{")])


def _left_processing(engine: Engine, seen: Observed) -> Observed:
    return replace(seen, past_deadline_max=2)


def _overlapping_sessions(engine: Engine, seen: Observed) -> Observed:
    """The second charge began 1 ms before the first one's effect closed its session."""
    first, second, *rest = sorted(seen.sessions, key=lambda s: s.begin)
    assert second.begin == first.end  # touching: the consistent history passes with it
    return replace(seen, sessions=[first, replace(second, begin=first.end - 0.001), *rest])


def _charge_without_session(engine: Engine, seen: Observed) -> Observed:
    return replace(seen, sessions=seen.sessions[1:])


@pytest.mark.parametrize(
    ("break_it", "invariants"),
    [
        (_lost_run, ["no submitted run lost"]),
        (_unfinished, ["every run completed after healing"]),
        (_double_effect, ["no effect applied twice for one step"]),
        # The stale reply's output is not the service's effect either.
        (
            _stale_accepted,
            [
                "every processed step holds its key's one effect",
                "no completion accepted from a superseded attempt",
            ],
        ),
        (_older_attempt, ["no completion accepted from a superseded attempt"]),
        (_crash_loop, ["no process crash-looping"]),
        (_poison_lost, ["every poison message dead-lettered with a reason"]),
        (_poison_without_reason, ["every poison message dead-lettered with a reason"]),
        (_left_processing, ["nothing left processing past deadline + sweep interval"]),
        (_overlapping_sessions, ["one charge at a time per account (agent side)"]),
        (_charge_without_session, ["one charge at a time per account (agent side)"]),
    ],
)
def test_each_violation_is_reported(
    engine: Engine, break_it: Callable[[Engine, Observed], Observed], invariants: list[str]
) -> None:
    seen = break_it(engine, _complete_history(engine))
    report = check(engine, seen)
    assert [v.split(":")[0] for v in report.violations] == invariants, report.text()
