"""Why a pending step waits, computed when it is read (never written per step): an open event
wait's event, backing off, no live agent instance, a breaker open, or the first budget that
would refuse it now, in the words the claim uses ("rate-limited: payments 100/s",
"concurrency: per-account 2 at once (key acct-7)"). It assumes the schedulers' default fleet
bound (no capacity factor)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, select

from sasflow.states import StepState
from sasflow.store.flow import limits
from sasflow.store.flow.budgets import Budgets, draws, read_budgets
from sasflow.store.flow.fleet import read_fleet
from sasflow.store.flow.keys import key_value
from sasflow.store.flow.pauses import all_pauses
from sasflow.store.flow.plan import FlowPlan, make_plan
from sasflow.store.schema import runs
from sasflow.store.sqltime import now
from sasflow.waits import EVENT_AGENT


def waiting_reasons(conn: Connection, steps: Sequence[Mapping[Any, Any]]) -> dict[int, str]:
    """Step id -> why it waits, for the `pending` ones of `steps` (rows with id, run_id, agent,
    action, state, not_before) that wait for something; a ready step with room is left out."""
    pending = [s for s in steps if s["state"] == StepState.PENDING]
    if not pending:
        return {}
    at: datetime = conn.execute(select(now())).scalar_one()
    plan = make_plan(limits.enabled_limits(conn), read_fleet(conn), pauses=all_pauses(conn))
    budgets: dict[str, Budgets] = {}
    found = {}
    for step in pending:
        reason = _reason(conn, plan, step, at, budgets)
        if reason is not None:
            found[int(step["id"])] = reason
    return found


def _reason(
    conn: Connection,
    plan: FlowPlan,
    step: Mapping[Any, Any],
    at: datetime,
    cache: dict[str, Budgets],
) -> str | None:
    agent = str(step["agent"])
    if agent == EVENT_AGENT:  # an open event wait (Step.wait_for): no agent, no budget
        given = step.get("input")
        wait: Mapping[str, Any] = given if isinstance(given, dict) else {}
        until = step["not_before"].isoformat(timespec="seconds")
        return (
            f"waiting for event {step['action']} (correlation {wait.get('correlation')!r}) "
            f"until {until}"
        )
    if step["not_before"] > at:
        return f"backing off until {step['not_before'].isoformat(timespec='seconds')}"
    if agent in plan.paused:
        return plan.paused_reason(agent)
    if agent not in plan.agents:
        return None
    state = cache.get(agent)
    if state is None:
        state = cache[agent] = read_budgets(conn, plan, plan.limits_of({agent}), {agent})
    keys = sorted({lim.key for lim in state.limits.values() if lim.key is not None}, key=str)
    values: Sequence[Any] = ()
    if keys:
        values = conn.execute(
            select(*(key_value(k) for k in keys)).where(runs.c.id == step["run_id"])
        ).one()
    row = SimpleNamespace(
        agent=agent, action=step["action"], **{f"k{i}": v for i, v in enumerate(values)}
    )
    t = state.at.timestamp()
    for key in draws(state, row, keys):
        reason = state.budgets[key].refusal(t)
        if reason is not None:
            return reason
    return None
