"""A limit's live state, as `sasflow limits show` and the console read it: its steps in flight
(per key: the busiest keys), the calls its rate would admit now, the ready steps it selects
(held while it has no room), and when a claim last admitted one."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from sasflow.store.flow import limits
from sasflow.store.flow.admission import Gcra
from sasflow.store.flow.fleet import read_fleet
from sasflow.store.flow.model import Limit
from sasflow.store.flow.plan import FlowPlan, make_plan
from sasflow.store.flow.queries import Family, Selector, in_flight, ready_count
from sasflow.store.sqltime import now

TOP_KEYS = 10


def limit_state(conn: Connection, limit: Limit, plan: FlowPlan) -> dict[str, Any]:
    """`in_flight` (total), `in_flight_keys` (the TOP_KEYS busiest, key -> steps), `tokens`
    (calls its rate admits now; None without a rate, or per key), `ready` (ready steps it
    selects), `resolved` (False: a dependency no live instance reports, which selects
    nothing), `actions` (what it selects: None for every action)."""
    actions: frozenset[str] | None = None
    if limit.actions is not None:
        actions = frozenset(limit.actions)
    if limit.dependency is not None:
        actions = plan.actions_of(limit)
        if actions is None:
            return {
                "resolved": False,
                "actions": [],
                "in_flight": 0,
                "in_flight_keys": {},
                "tokens": None,
                "ready": 0,
            }
    selector = Selector(limit.agent, actions)
    at: datetime = conn.execute(select(now())).scalar_one()
    counts = {
        str(r.key): int(r.n)
        for r in conn.execute(in_flight((Family(limit.name, selector, limit.key),)))
        if int(r.n) > 0
    }
    busiest = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_KEYS]
    tokens = None
    if limit.rate is not None and limit.key is None:
        tat = limits.busy_buckets(conn, [limit.name], at).get((limit.name, ""))
        tokens = Gcra.of(limit.rate, limit.effective_burst, tat).tokens(at.timestamp())
    return {
        "resolved": True,
        "actions": None if actions is None else sorted(actions),
        "in_flight": sum(counts.values()),
        "in_flight_keys": dict(busiest) if limit.key is not None else {},
        "tokens": tokens,
        "ready": int(conn.execute(ready_count(selector)).scalar_one()),
    }


def held_counts(conn: Connection) -> dict[str, int]:
    """Enabled limit -> its ready steps (what `sasflow_limit_held_steps` shows); an unresolved
    dependency limit counts none."""
    plan = make_plan(limits.enabled_limits(conn), read_fleet(conn))
    found = {}
    for limit in plan.limits:
        actions = frozenset(limit.actions) if limit.actions is not None else None
        if limit.dependency is not None:
            actions = plan.actions_of(limit)
        if limit.dependency is not None and actions is None:
            found[limit.name] = 0
            continue
        found[limit.name] = int(
            conn.execute(ready_count(Selector(limit.agent, actions))).scalar_one()
        )
    return found
