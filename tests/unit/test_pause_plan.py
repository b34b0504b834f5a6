"""The flow plan's view of the operators' pauses (store/flow/plan.py), without a database: a
whole agent's pause leaves it out of both claims whatever its actions' pauses; some actions'
pause sends the agent to the budgeted claim with a hold on those actions."""

from __future__ import annotations

from sasflow.store.flow.fleet import FleetView
from sasflow.store.flow.plan import PauseHold, make_plan


def _rows(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"agent": agent, "action": action} for agent, action in pairs]


def test_a_whole_agents_pause_wins_over_its_actions_pauses() -> None:
    plan = make_plan(
        [], FleetView(), pauses=_rows(("pay", "refund"), ("pay", ""), ("mail", "send"))
    )
    assert plan.pauses == (PauseHold("mail", frozenset({"send"})), PauseHold("pay"))
    assert (plan.paused, plan.agents) == (frozenset({"pay"}), frozenset({"mail"}))
    assert plan.paused_reason("pay") == "agent pay paused by an operator"


def test_paused_actions_are_one_hold_of_the_budgeted_claim() -> None:
    plan = make_plan([], FleetView(), pauses=_rows(("pay", "refund"), ("pay", "charge")))
    (hold,) = plan.pauses
    assert (hold.actions, hold.reason) == (
        frozenset({"charge", "refund"}),
        "pay charge, refund paused by an operator",
    )
    assert (plan.paused, plan.agents) == (frozenset(), frozenset({"pay"}))


def test_an_agent_with_no_live_instance_keeps_its_fleet_reason() -> None:
    plan = make_plan([], FleetView(known=frozenset({"pay"})))
    assert (plan.paused, plan.paused_reason("pay")) == (
        frozenset({"pay"}),
        "no live agent instance",
    )
