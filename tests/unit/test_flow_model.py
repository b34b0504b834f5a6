"""Flow limits' definitions (store/flow/model.py) and the scheduler's flow plan
(store/flow/plan.py): what is refused and why, rates as operators write them, keys, and the
fleet bound and breaker holds a plan derives from the fleet."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from sasflow.errors import InvalidLimitError
from sasflow.store.flow.fleet import FleetView, OpenBreaker
from sasflow.store.flow.model import KeyExpr, KeyKind, Limit, format_rate, parse_rate
from sasflow.store.flow.plan import make_plan

AT = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "Pay"}, "limit name 'Pay' must match"),
        ({"agent": "no spaces"}, "agent name 'no spaces' must match"),
        ({"rate": None, "concurrency": None}, "limit 'pay' needs a rate, a concurrency or both"),
        ({"rate": 0.0}, "the rate must be > 0"),
        ({"rate": None, "burst": 3, "concurrency": 1}, "a burst needs a rate"),
        ({"burst": 0}, "the burst must be 1 to"),
        ({"concurrency": -1}, "the concurrency must be 0 (paused) to"),
        ({"actions": ()}, "a limit names 1 to 100 actions"),
        (
            {"actions": ("a",), "dependency": "gw"},
            "a limit selects actions or a dependency, not both",
        ),
    ],
)
def test_a_bad_limit_is_refused_with_the_reason(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"name": "pay", "agent": "pay", "rate": 10.0, **kwargs}
    with pytest.raises(InvalidLimitError, match="^" + re.escape(message)):
        Limit(**fields)  # type: ignore[arg-type]


def test_rates_read_as_operators_write_them_and_print_back() -> None:
    assert parse_rate("100/s") == 100.0
    assert parse_rate("6000/min") == 100.0
    assert parse_rate("36/h") == pytest.approx(0.01)
    assert parse_rate("2.5") == 2.5
    for bad in ("fast", "10/week", "0/s", "-1/s"):
        with pytest.raises(InvalidLimitError):
            parse_rate(bad)
    assert [format_rate(r) for r in (100.0, 0.1, 1 / 60, 1 / 7)] == [
        "100/s",
        "6/min",
        "1/min",
        "0.142857/s",
    ]


def test_the_burst_defaults_to_one_second_of_the_rate() -> None:
    assert Limit("a", "a", rate=0.5).effective_burst == 1
    assert Limit("a", "a", rate=99.5).effective_burst == 100
    assert Limit("a", "a", rate=99.5, burst=7).effective_burst == 7
    described = Limit("a", "a", rate=100, concurrency=40, key=KeyExpr.parse("input.account"))
    assert described.describe() == "100/s (burst 100), 40 at once, per input.account"


def test_keys_are_a_dotted_path_of_the_run_input_the_business_key_or_the_workflow() -> None:
    assert KeyExpr.parse("input.customer.id") == KeyExpr(KeyKind.INPUT, ("customer", "id"))
    assert str(KeyExpr.parse("input.customer.id")) == "input.customer.id"
    assert KeyExpr.parse("business_key").kind == KeyKind.BUSINESS_KEY
    assert KeyExpr.parse("workflow").kind == KeyKind.WORKFLOW
    for bad in ("input", "input.", "output.x", "input.a b", "input.a'--"):
        with pytest.raises(InvalidLimitError, match="must be `input"):
            KeyExpr.parse(bad)


def test_a_limit_selects_its_agent_its_actions_or_its_dependency_as_resolved() -> None:
    every = Limit("a", "pay", rate=1)
    some = Limit("b", "pay", actions=("charge",), rate=1)
    dependency = Limit("c", "pay", dependency="gateway", rate=1)
    assert every.selects("pay", "refund", None)
    assert not every.selects("other", "refund", None)
    assert some.selects("pay", "charge", None)
    assert not some.selects("pay", "refund", None)
    assert not dependency.selects("pay", "charge", None)  # unresolved: selects nothing
    assert dependency.selects("pay", "charge", frozenset({"charge"}))


def test_the_plan_bounds_agents_by_live_capacity_and_pauses_those_with_none_live() -> None:
    fleet = FleetView(
        known=frozenset({"pay", "gone"}),
        capacity={"pay": 3},
        uses={("pay", "gateway"): frozenset({"charge"})},
        open_breakers=(
            OpenBreaker("pay", "gateway", AT),
            OpenBreaker("pay", "unknown-dep", AT),  # no action reports using it: no hold
        ),
    )
    limits = [
        Limit("dep", "pay", dependency="gateway", concurrency=1),
        Limit("off", "other", rate=1, enabled=False),
    ]
    plan = make_plan(limits, fleet, fleet_factor=2.0)
    assert make_plan(limits, fleet).bounds["pay"].bound is None  # no capacity bound by default
    assert plan.bounds["pay"].bound == 6
    assert plan.bounds["gone"].bound == 0
    assert plan.bounds["gone"].reason == "no live agent instance"
    assert plan.paused == {"gone"}
    assert plan.agents == {"pay"}  # the disabled limit's agent is not budgeted
    assert [h.name for h in plan.breakers] == ["breaker:pay/gateway"]
    assert plan.actions_of(limits[0]) == frozenset({"charge"})
    assert plan.breakers[0].reason(AT).startswith("breaker half-open: pay/gateway")
    unbounded = make_plan(limits, fleet, fleet_bound=False, fleet_factor=2.0)
    assert (unbounded.bounds, unbounded.paused) == ({}, frozenset())


def test_the_steps_a_concurrency_limit_selects_are_exclusive() -> None:
    fleet = FleetView(
        known=frozenset({"pay"}),
        capacity={"pay": 3},
        uses={("pay", "gateway"): frozenset({"refund"})},
        open_breakers=(),
    )
    limits = [
        Limit("one", "pay", actions=("charge",), key=KeyExpr.parse("input.a"), concurrency=1),
        Limit("gateway", "pay", dependency="gateway", concurrency=5),
        Limit("rate", "mail", rate=10),
        Limit("off", "ship", concurrency=1, enabled=False),
    ]
    plan = make_plan(limits, fleet, fleet_factor=2.0)
    assert plan.exclusive("pay", "charge")
    assert plan.exclusive("pay", "refund")  # through the dependency the fleet resolved
    assert not plan.exclusive("pay", "other")
    assert not plan.exclusive("mail", "send")  # a rate alone
    assert not plan.exclusive("ship", "go")  # disabled
    assert not make_plan([], fleet, fleet_factor=2.0).exclusive("pay", "charge")  # a fleet bound
