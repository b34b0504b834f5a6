"""The budgets of a claim: the families of budgets that cover the agents it claims for (the
limits, their fleet bound, their breakers' holds), the steps each has in flight per key, its
rate buckets, and the budgets themselves, made per key on first use. Read by the budgeted
claim (store/flow/claim.py) under its locks, and by `explain` without them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection

from sasflow.store.flow.admission import Budget, BudgetKey, limit_budget
from sasflow.store.flow.model import KeyExpr, Limit
from sasflow.store.flow.plan import FlowPlan
from sasflow.store.flow.queries import Family, Selector, budget_reads

_NEVER = datetime.min.replace(tzinfo=UTC)


@dataclass
class Budgets:
    """The claim's budgets and what each family covers."""

    at: datetime
    families: dict[str, Family] = field(default_factory=dict)
    limits: dict[str, Limit] = field(default_factory=dict)
    budgets: dict[BudgetKey, Budget] = field(default_factory=dict)
    counts: dict[BudgetKey, int] = field(default_factory=dict)
    tats: dict[BudgetKey, datetime] = field(default_factory=dict)
    opens: list[datetime] = field(default_factory=list)

    def of_limit(self, limit: Limit, key: str) -> BudgetKey:
        """The budget of `limit` for `key`, made on first use."""
        found = (limit.name, key)
        if found not in self.budgets:
            self.budgets[found] = limit_budget(
                limit, key, in_flight=self.counts.get(found, 0), tat=self.tats.get(found)
            )
        return found


def read_budgets(
    conn: Connection, plan: FlowPlan, limits: Sequence[Limit], agents: set[str]
) -> Budgets:
    """Every family of `limits` (the claim's, locked) and of the plan's implicit bounds over
    `agents`, their steps in flight per key and their busy buckets, read in one statement with
    the database's clock (`Budgets.at`, the statement's time: after any lock the transaction
    waited for); and the budgets of the families without a key (those with one get theirs per
    key, on first use)."""
    state = Budgets(_NEVER)
    counted = _families(state, plan, limits, agents)
    rated = [n for n, lim in state.limits.items() if lim.rate is not None]
    for row in conn.execute(budget_reads(tuple(counted), tuple(rated))):
        if row.kind == "t":
            state.at = row.at
        elif row.kind == "c":
            state.counts[(row.name, row.key)] = int(row.n)
        else:
            state.tats[(row.name, row.key)] = row.at
    for name, limit in state.limits.items():
        if limit.key is None:
            state.of_limit(limit, "")
        else:  # the keys in flight or in a busy bucket: those that may be exhausted
            for key in {k for n, k in (*state.counts, *state.tats) if n == name}:
                state.of_limit(limit, key)
    _implicit(state, plan)
    return state


def _implicit(state: Budgets, plan: FlowPlan) -> None:
    """The budgets of the fleet bounds, breaker holds and operators' pauses among the
    families."""
    at = state.at
    for bound in plan.bounds.values():
        if bound.name in state.families and bound.bound is not None:
            room = bound.bound - state.counts.get((bound.name, ""), 0)
            state.budgets[(bound.name, "")] = Budget(room=room, concurrency_reason=bound.reason)
    for hold in plan.breakers:
        if hold.name in state.families:
            room = 0 if at < hold.until else 1 - state.counts.get((hold.name, ""), 0)
            state.budgets[(hold.name, "")] = Budget(room=room, concurrency_reason=hold.reason(at))
            if at < hold.until:
                state.opens.append(hold.until)
    for pause in plan.pauses:
        if pause.name in state.families:
            state.budgets[(pause.name, "")] = Budget(room=0, concurrency_reason=pause.reason)


def _families(
    state: Budgets, plan: FlowPlan, locked: Sequence[Limit], agents: set[str]
) -> list[Family]:
    """Register the families of the claim (the locked limits, whose dependency the fleet
    resolves; the fleet bounds and breaker holds of `agents`); the ones whose steps in flight
    count."""
    counted = []
    for limit in locked:
        actions = frozenset(limit.actions) if limit.actions is not None else None
        if limit.dependency is not None:
            actions = plan.actions_of(limit)
            if actions is None:
                continue  # no live instance reports the dependency: it selects nothing yet
        family = Family(limit.name, Selector(limit.agent, actions), limit.key)
        state.limits[limit.name] = limit
        state.families[limit.name] = family
        if limit.concurrency is not None:
            counted.append(family)
    for agent, bound in sorted(plan.bounds.items()):
        if agent in agents and bound.bound:
            state.families[bound.name] = Family(bound.name, Selector(agent))
            counted.append(state.families[bound.name])
    for hold in plan.breakers:
        if hold.agent in agents:
            state.families[hold.name] = Family(hold.name, Selector(hold.agent, hold.actions))
            counted.append(state.families[hold.name])  # its one trial, once half-open
    for pause in plan.pauses:  # some actions paused: no room, nothing in flight to count
        if pause.agent in agents and pause.actions is not None:
            state.families[pause.name] = Family(pause.name, Selector(pause.agent, pause.actions))
    return counted


def draws(state: Budgets, row: Any, keys: Sequence[KeyExpr]) -> tuple[BudgetKey, ...]:
    """The budgets a candidate row draws from."""
    draws = []
    for name, family in state.families.items():
        if not family.selector.covers(row.agent, row.action):
            continue
        limit = state.limits.get(name)
        if limit is None or limit.key is None:  # an implicit bound, or a limit without a key
            draws.append((name, ""))
        else:
            draws.append(state.of_limit(limit, getattr(row, f"k{keys.index(limit.key)}")))
    return tuple(draws)
