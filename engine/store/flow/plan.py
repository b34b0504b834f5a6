"""What a scheduler caches of flow control between two reads (every few seconds, and when an
operator changes a limit): the enabled limits, with each dependency limit resolved to the
actions the fleet reports using it, the implicit fleet bound of each agent and the breakers
held open. Built without I/O from what `limits.enabled_limits` and `fleet.read_fleet` read.

The plan only routes: the agents it names are claimed by the budgeted claim (store/flow/
claim.py), which reads the limits again under lock, so a change of a limit's numbers takes
effect at once; the plan's age only delays a new limit's agent joining the budgeted claim (and
the resolution of dependencies, and the fleet's view) by one refresh.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from sasflow.store.flow.fleet import FleetView
from sasflow.store.flow.model import Limit
from sasflow.store.flow.pauses import WHOLE_AGENT


@dataclass(frozen=True)
class FleetBound:
    """An agent's implicit concurrency: `bound` steps in flight cluster-wide (0: it has no live
    instance; None: no bound but that)."""

    agent: str
    capacity: int
    bound: int | None

    @property
    def name(self) -> str:
        return f"fleet:{self.agent}"

    @property
    def reason(self) -> str:
        if self.bound == 0:
            return "no live agent instance"
        return f"fleet bound: {self.agent} {self.bound} at once (live capacity {self.capacity})"


@dataclass(frozen=True)
class BreakerHold:
    """A dependency's breaker open somewhere in the fleet: its steps wait until `until`, then
    one at a time (the half-open trial) until no live instance reports it open."""

    agent: str
    dependency: str
    actions: frozenset[str]
    until: datetime

    @property
    def name(self) -> str:
        return f"breaker:{self.agent}/{self.dependency}"

    def reason(self, at: datetime) -> str:
        if at < self.until:
            return (
                f"breaker open: {self.agent}/{self.dependency} until "
                f"{self.until.isoformat(timespec='seconds')}"
            )
        return f"breaker half-open: {self.agent}/{self.dependency}, one trial at a time"


@dataclass(frozen=True)
class PauseHold:
    """An agent, or some of its actions, paused by an operator (ops/pause.py): none of its
    steps is claimed until it is resumed."""

    agent: str
    actions: frozenset[str] | None = None
    """None: the whole agent."""

    @property
    def name(self) -> str:
        return f"paused:{self.agent}"

    @property
    def reason(self) -> str:
        if self.actions is None:
            return f"agent {self.agent} paused by an operator"
        return f"{self.agent} {', '.join(sorted(self.actions))} paused by an operator"


@dataclass(frozen=True)
class FlowPlan:
    limits: tuple[Limit, ...] = ()
    """The enabled limits, by name."""
    uses: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    """(agent, dependency) -> the actions using it, as the live fleet reports them."""
    bounds: Mapping[str, FleetBound] = field(default_factory=dict)
    breakers: tuple[BreakerHold, ...] = ()
    pauses: tuple[PauseHold, ...] = ()
    """The operators' pauses, by agent: a whole agent's is in `paused`, some actions' are holds
    of the budgeted claim."""

    def actions_of(self, limit: Limit) -> frozenset[str] | None:
        """The actions a dependency limit selects (None: unresolved, it selects nothing)."""
        if limit.dependency is None:
            return None
        return self.uses.get((limit.agent, limit.dependency))

    def selects(self, limit: Limit, agent: str, action: str) -> bool:
        return limit.selects(agent, action, self.actions_of(limit))

    @cached_property
    def paused(self) -> frozenset[str]:
        """Agents paused by an operator, or with instance rows but no live instance: none of
        their steps is claimed."""
        idle = {a for a, b in self.bounds.items() if b.bound == 0}
        return frozenset(idle | {p.agent for p in self.pauses if p.actions is None})

    def paused_reason(self, agent: str) -> str:
        """Why none of a paused agent's steps is claimed."""
        for pause in self.pauses:
            if pause.agent == agent and pause.actions is None:
                return pause.reason
        return self.bounds[agent].reason

    @cached_property
    def agents(self) -> frozenset[str]:
        """The agents the budgeted claim takes (the others: the plain claim)."""
        limited = {limit.agent for limit in self.limits}
        limited.update(b.agent for b in self.breakers)
        limited.update(a for a, b in self.bounds.items() if b.bound)
        limited.update(p.agent for p in self.pauses)
        return frozenset(limited - self.paused)

    def limits_of(self, agents: frozenset[str] | set[str]) -> tuple[Limit, ...]:
        return tuple(limit for limit in self.limits if limit.agent in agents)

    def exclusive(self, agent: str, action: str) -> bool:
        """Whether a concurrency limit selects the steps of `agent`/`action`: their requests
        go out `exclusive` (run at most once per attempt, see messages.Request)."""
        return any(
            limit.concurrency is not None and self.selects(limit, agent, action)
            for limit in self.limits
        )


NO_PLAN = FlowPlan()
"""No limit, no fleet: every agent is claimed by the plain claim."""


def make_plan(
    limits: list[Limit],
    fleet: FleetView,
    *,
    fleet_bound: bool = True,
    fleet_factor: float | None = None,
    pauses: Sequence[Mapping[str, Any]] = (),
) -> FlowPlan:
    """The plan of these limits over this fleet. With `fleet_bound`, an agent that has instance
    rows but no live instance is paused (none of its steps is claimed), and with `fleet_factor`
    each other agent known to the fleet is bounded to ceil(factor * its live capacity) steps in
    flight; an agent with no instance rows (an agent speaking the wire protocol without
    heartbeats) gets no implicit bound. `pauses`: the operators' (store/flow/pauses.py rows)."""
    bounds = {}
    if fleet_bound:
        for agent in sorted(fleet.known):
            capacity = fleet.capacity.get(agent, 0)
            bound = None if fleet_factor is None else math.ceil(capacity * fleet_factor)
            bounds[agent] = FleetBound(agent, capacity, 0 if capacity == 0 else bound)
    holds = tuple(
        BreakerHold(b.agent, b.dependency, fleet.uses[(b.agent, b.dependency)], b.until)
        for b in fleet.open_breakers
        if (b.agent, b.dependency) in fleet.uses
    )
    return FlowPlan(
        pauses=_pause_holds(pauses),
        limits=tuple(sorted((lim for lim in limits if lim.enabled), key=lambda lim: lim.name)),
        uses=fleet.uses,
        bounds=bounds,
        breakers=holds,
    )


def _pause_holds(rows: Sequence[Mapping[str, Any]]) -> tuple[PauseHold, ...]:
    """One hold per agent: the whole agent's when it is paused, else its paused actions'."""
    pairs = [(str(r["agent"]), str(r["action"])) for r in rows]
    whole = {agent for agent, action in pairs if action == WHOLE_AGENT}
    some: dict[str, set[str]] = {}
    for agent, action in pairs:
        if agent not in whole:
            some.setdefault(agent, set()).add(action)
    holds = [PauseHold(agent) for agent in whole]
    holds += [PauseHold(agent, frozenset(actions)) for agent, actions in some.items()]
    return tuple(sorted(holds, key=lambda h: h.agent))
