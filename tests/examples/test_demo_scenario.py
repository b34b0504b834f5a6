"""The demo's scenario and simulated services behave as the demo's story needs (no I/O)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from sasflow.agents import PermanentError
from sasflow.demo.app import COOL_OFF_S, EXPRESS_WAIT_S, PAYMENT_WAIT_S, build_registry
from sasflow.demo.scenario import (
    AGENT_CRASH,
    DECLINED_CARD,
    GATEWAY_TIMEOUTS,
    UNDELIVERABLE,
    Scenario,
)
from sasflow.demo.services import Happenings, RemoteServices


@pytest.mark.parametrize(("orders", "seed"), [(6, 1), (40, 7), (50, 7), (500, 3)])
def test_each_trouble_meets_a_different_order_of_the_right_workflow(orders: int, seed: int) -> None:
    scenario = Scenario.build(orders, seed)
    troubled = [scenario.declined, scenario.undeliverable, scenario.crash, scenario.flaky]
    assert len(set(troubled)) == 4
    assert all(1 <= n <= orders for n in troubled)
    assert scenario.workflow(scenario.declined) == "b2b-order"
    assert scenario.workflow(scenario.undeliverable) == "order"
    inputs = {n: scenario.order(n) for n in range(1, orders + 1)}
    assert [n for n, i in inputs.items() if i["card"] == DECLINED_CARD] == [scenario.declined]
    assert [n for n, i in inputs.items() if i["address"] == UNDELIVERABLE] == [
        scenario.undeliverable
    ]
    assert [n for n, i in inputs.items() if i["trouble"] == AGENT_CRASH] == [scenario.crash]
    assert [n for n, i in inputs.items() if i["trouble"] == GATEWAY_TIMEOUTS] == [scenario.flaky]
    assert 1 <= scenario.early <= orders
    assert scenario.early not in troubled
    # The express order whose confirmation is withheld: untroubled, not the early one.
    assert 1 <= scenario.unconfirmed <= orders
    assert scenario.unconfirmed not in {*troubled, scenario.early}
    assert scenario.workflow(scenario.unconfirmed) == "express-order"
    assert [n for n in inputs if scenario.workflow(n) == "express-order"] == [scenario.unconfirmed]


def test_the_same_seed_gives_the_same_orders_and_another_seed_other_ones() -> None:
    first, again, other = Scenario.build(40, 7), Scenario.build(40, 7), Scenario.build(40, 8)
    assert first == again
    assert [first.order(n) for n in range(1, 41)] == [again.order(n) for n in range(1, 41)]
    assert [first.order(n) for n in range(1, 41)] != [other.order(n) for n in range(1, 41)]


def test_fewer_orders_than_the_troubles_need_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 6 orders"):
        Scenario.build(5)


def _past_resets(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`call()` again while the gateway's random connection resets get in the way."""
    for _ in range(50):
        try:
            return call()
        except ConnectionError:
            continue
    raise AssertionError("50 connection resets in a row")


def test_the_gateway_times_out_three_tries_then_charges_once_for_the_key() -> None:
    services = RemoteServices(Scenario.build(40, 7), Happenings())
    for _ in range(3):
        with pytest.raises(TimeoutError):
            services.charge("key-1", 10, "4242424242424242", GATEWAY_TIMEOUTS, 1.0)
    charged = _past_resets(
        lambda: services.charge("key-1", 10, "4242424242424242", GATEWAY_TIMEOUTS, 1.0)
    )
    assert charged == {"charge": "CH-key-1", "amount": 10}


def test_a_declined_card_and_an_undeliverable_address_are_permanent_errors() -> None:
    services = RemoteServices(Scenario.build(40, 7), Happenings())
    with pytest.raises(PermanentError, match="card declined"):
        _past_resets(lambda: services.charge("key-2", 10, DECLINED_CARD, None, 1.0))
    with pytest.raises(PermanentError, match="cannot deliver"):
        services.ship("key-3", UNDELIVERABLE, 1.0)


def test_the_warehouse_is_down_for_the_outage_from_the_scenarios_call_on() -> None:
    scenario = Scenario(
        orders=9,
        seed=1,
        declined=1,
        undeliverable=2,
        crash=3,
        flaky=4,
        b2b=frozenset({1}),
        outage_at=3,
        outage_seconds=0.3,
    )
    feed = Happenings()
    services = RemoteServices(scenario, feed)
    services.reserve("a", "mug", 1, 1.0)
    services.reserve("b", "mug", 1, 1.0)
    with pytest.raises(ConnectionError):
        services.reserve("c", "mug", 1, 1.0)
    time.sleep(0.35)
    assert services.reserve("c", "mug", 1, 1.0)["reservation"] == "R-c"
    assert feed.snapshot() == {"outage": 2}


def test_the_demo_registry_validates_and_holds_both_workflows() -> None:
    registry = build_registry(RemoteServices(Scenario.build(), Happenings()))
    assert {(w.name, w.on_failure) for w in registry.workflows} == {
        ("order", "compensate"),
        ("b2b-order", "error"),
        ("express-order", "compensate"),
    }
    assert sorted(a.name for a in registry.agents) == ["inventory", "payments", "shipping"]
    for workflow in registry.workflows:
        assert [s.name for s in workflow.steps] == [
            "reserve",
            "charge",
            "payment_confirmed",
            "cool_off",
            "ship",
        ]
        wait, timer = workflow.steps[2], workflow.steps[3]
        assert wait.is_event_wait
        assert wait.action == "payment_confirmed"
        assert wait.wait is not None
        timeout = EXPRESS_WAIT_S if workflow.name == "express-order" else PAYMENT_WAIT_S
        assert (str(wait.wait.match), wait.wait.timeout) == ("input.order_id", timeout)
        # A retail or express order whose payment is never confirmed is refunded; a b2b one
        # goes to a person.
        expected = "fail" if workflow.name == "b2b-order" else "compensate"
        assert wait.wait.on_timeout == expected
        assert (timer.is_timer, timer.sleep_s) == (True, COOL_OFF_S)
