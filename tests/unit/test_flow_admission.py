"""The budgeted claim's admission (store/flow/admission.py), a pure function: GCRA rates with
their burst, concurrency globally and per key, several limits on one step, claim order kept
within the budget, and never a step beyond any budget."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from sasflow.store.flow.admission import (
    Budget,
    Candidate,
    Gcra,
    admit,
    earliest_wait,
    exhausted,
    limit_budget,
)
from sasflow.store.flow.model import KeyExpr, Limit

T0 = 1_000_000.0
"""A database time (epoch seconds) for the tests."""


def _rate(rate: float, burst: int, tat: float | None = None) -> Budget:
    limit = Limit("pay", "pay", rate=rate, burst=burst)
    at = None if tat is None else datetime.fromtimestamp(tat, UTC)
    return limit_budget(limit, "", in_flight=0, tat=at)


def _steps(count: int, *budgets: str) -> list[Candidate]:
    return [Candidate(i, tuple((b, "") for b in budgets)) for i in range(1, count + 1)]


def test_a_fresh_rate_admits_its_burst_then_one_call_per_interval() -> None:
    budgets = {("pay", ""): _rate(10, 3)}
    first = admit(_steps(10, "pay"), budgets, T0, want=100)
    assert first.admitted == [1, 2, 3]
    assert set(first.reasons.values()) == {"rate-limited: pay 10/s"}
    assert first.wait(T0) == pytest.approx(0.1)
    later = admit(_steps(10, "pay"), first.budgets, T0 + 0.05, want=100)
    assert later.admitted == []
    refilled = admit(_steps(10, "pay"), first.budgets, T0 + 0.1, want=100)
    assert refilled.admitted == [1]
    idle = admit(_steps(10, "pay"), first.budgets, T0 + 60, want=100)
    assert idle.admitted == [1, 2, 3]  # never more than the burst, however long the idle time


def test_a_sustained_backlog_gets_exactly_the_rate_plus_the_burst() -> None:
    """Claims every 10 ms for 10 s at 50/s with burst 5: 5 + 50 * 10 calls, no more."""
    budgets = {("pay", ""): _rate(50, 5)}
    admitted = 0
    for tick in range(1001):
        done = admit(_steps(100, "pay"), budgets, T0 + tick * 0.01, want=100)
        budgets = done.budgets
        admitted += len(done.admitted)
    assert admitted == 5 + 500


def test_concurrency_admits_the_room_left_and_a_paused_limit_admits_nothing() -> None:
    limit = Limit("warehouse", "wh", concurrency=5)
    budget = limit_budget(limit, "", in_flight=3, tat=None)
    done = admit(_steps(4, "warehouse"), {("warehouse", ""): budget}, T0, want=100)
    assert done.admitted == [1, 2]
    assert done.reasons == {
        3: "concurrency: warehouse 5 at once",
        4: "concurrency: warehouse 5 at once",
    }
    paused = limit_budget(Limit("wh-off", "wh", concurrency=0), "", in_flight=0, tat=None)
    done = admit(_steps(2, "wh-off"), {("wh-off", ""): paused}, T0, want=100)
    assert (done.admitted, set(done.reasons.values())) == ([], {"paused: wh-off (concurrency 0)"})


def test_concurrency_per_key_holds_only_the_keys_at_their_bound() -> None:
    limit = Limit("per-account", "pay", key=KeyExpr.parse("input.account"), concurrency=1)
    keys = ["a", "a", "b", "a", "c", "b"]
    candidates = [Candidate(i, (("per-account", k),)) for i, k in enumerate(keys, 1)]
    budgets = {("per-account", k): limit_budget(limit, k, in_flight=0, tat=None) for k in "abc"}
    budgets[("per-account", "c")] = limit_budget(limit, "c", in_flight=1, tat=None)
    done = admit(candidates, budgets, T0, want=100)
    assert done.admitted == [1, 3]
    assert done.reasons[2] == "concurrency: per-account 1 at once (key a)"
    assert done.reasons[5] == "concurrency: per-account 1 at once (key c)"


def test_a_step_under_several_limits_needs_all_of_them_and_a_held_one_draws_from_none() -> None:
    """Rate 10/s burst 2 on the agent and 1 at once per key: the key-a step held by its key's
    concurrency does not spend the rate's call; the next key's step gets it."""
    per_key = Limit("per-account", "pay", key=KeyExpr.parse("input.account"), concurrency=1)
    budgets = {
        ("pay", ""): _rate(10, 2),
        ("per-account", "a"): limit_budget(per_key, "a", in_flight=0, tat=None),
        ("per-account", "b"): limit_budget(per_key, "b", in_flight=0, tat=None),
        ("per-account", "c"): limit_budget(per_key, "c", in_flight=0, tat=None),
    }
    candidates = [
        Candidate(1, (("pay", ""), ("per-account", "a"))),
        Candidate(2, (("pay", ""), ("per-account", "a"))),
        Candidate(3, (("pay", ""), ("per-account", "b"))),
        Candidate(4, (("pay", ""), ("per-account", "c"))),
    ]
    done = admit(candidates, budgets, T0, want=100)
    assert done.admitted == [1, 3]
    assert done.held == {2: ("per-account", "a"), 4: ("pay", "")}
    assert done.drawn == {("pay", ""): 2, ("per-account", "a"): 1, ("per-account", "b"): 1}


def test_claim_order_is_kept_within_the_budget_and_want_bounds_the_batch() -> None:
    """The candidates come in claim order (priority first): the first ones the budget allows
    are the ones admitted, and no more than `want`."""
    budgets = {("pay", ""): Budget(room=3)}
    done = admit(_steps(10, "pay"), budgets, T0, want=100)
    assert done.admitted == [1, 2, 3]
    done = admit(_steps(10, "pay"), {("pay", ""): Budget(room=50)}, T0, want=4)
    assert done.admitted == [1, 2, 3, 4]


def test_nothing_is_ever_admitted_beyond_any_budget() -> None:
    """Random budgets (rooms, rates, bursts) and candidates drawing from random subsets:
    per budget, admitted <= room, and the admitted calls conform to GCRA one by one."""
    rng = random.Random(7)  # noqa: S311 - reproducible test data, not a secret
    for _ in range(300):
        names = [f"l{i}" for i in range(rng.randint(1, 4))]
        budgets = {}
        for name in names:
            room = rng.choice([None, 0, 1, 3, 10])
            rate = rng.choice([None, Gcra.of(rng.choice([1.0, 20.0]), rng.randint(1, 5), None)])
            budgets[(name, "")] = Budget(room=room, gcra=rate)
        candidates = [
            Candidate(i, tuple((n, "") for n in rng.sample(names, rng.randint(1, len(names)))))
            for i in range(rng.randint(0, 40))
        ]
        done = admit(candidates, budgets, T0, want=rng.randint(1, 50))
        by_id = {c.id: c for c in candidates}
        for key, budget in budgets.items():
            count = sum(1 for i in done.admitted if key in by_id[i].budgets)
            if budget.room is not None:
                assert count <= budget.room
            if budget.gcra is not None:
                assert count <= budget.gcra.tokens(T0) + 1e-9


def test_exhausted_budgets_and_the_wait_until_a_rate_admits_again() -> None:
    spent = _rate(4, 1, tat=T0 + 0.25)  # one call 0 s ago: the next at T0 + 0.25
    budgets = {("pay", ""): spent, ("wh", ""): Budget(room=0, concurrency_reason="full")}
    assert exhausted(budgets, T0) == {("pay", ""): "rate-limited: pay 4/s", ("wh", ""): "full"}
    assert earliest_wait(budgets.values(), T0) == pytest.approx(0.25)
    assert earliest_wait(budgets.values(), T0 + 0.3) is None
    assert spent.gcra is not None
    assert spent.gcra.tokens(T0 + 0.25) == pytest.approx(1.0)
