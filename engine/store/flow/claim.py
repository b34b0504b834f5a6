"""The budgeted claim: the steps of the agents a flow plan names (store/flow/plan.py), claimed
under their limits, fleet bound and breaker holds, exactly across schedulers, on the database
clock. One transaction:

1. lock the enabled limits of those agents, in name order (`limits.lock_limits`): the claims of
   one limit are serialized across every scheduler and host;
2. then (a new statement: a new READ COMMITTED snapshot, which sees what the claimers before us
   committed) read the clock, count the steps in flight per budget, and read the rate buckets;
3. leave out of the candidates the steps of every budget that admits nothing now, and lock up
   to a batch of the remaining ready steps in claim order (`FOR UPDATE SKIP LOCKED`);
4. admit them with the pure `admission.admit`, claim the admitted ones as the plain claim does
   (`runs.claim.claim_chosen`), write the buckets.

A held step is not written: it stays `pending`, its `not_before` untouched, never charged.
SQLite runs the same statements without FOR UPDATE (one writer at a time).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from sasflow.store.flow import limits as rows
from sasflow.store.flow.admission import Admission, BudgetKey, Candidate, admit
from sasflow.store.flow.admission import exhausted as exhausted_budgets
from sasflow.store.flow.budgets import Budgets, draws, read_budgets
from sasflow.store.flow.model import KeyExpr, Limit
from sasflow.store.flow.plan import FlowPlan
from sasflow.store.flow.queries import Excluded, Selector, candidates
from sasflow.store.runs.claim import ClaimedStep, claim, claim_chosen

ADMITTED_PRECISION = timedelta(seconds=1)
"""How stale a limit's `last_admitted_at` may be."""
MIN_WAIT = 0.005
"""Seconds a scheduler waits at least before claiming again for a rate: at a high rate each
claim then admits several steps, not one."""


@dataclass
class BudgetedClaim:
    claimed: list[ClaimedStep] = field(default_factory=list)
    due: float | None = None
    """Seconds until a rate admits a step again, a breaker's hold ends or a backoff ends,
    whichever is first (None: none of them)."""
    full: bool = False
    """The candidates filled the batch and some were admitted: more may be ready."""
    admitted: dict[str, int] = field(default_factory=dict)
    """Limit (or implicit bound) -> steps it admitted."""
    held: dict[str, int] = field(default_factory=dict)
    """Limit (or implicit bound) -> candidates it held back in this claim."""
    tokens: dict[str, float] = field(default_factory=dict)
    """Rate limit without a key -> calls it would admit now, after this claim."""
    limited: bool = False
    """Some budget admitted nothing at the claim (its steps were left out of the candidates)."""


def claim_budgeted(
    conn: Connection,
    plan: FlowPlan,
    *,
    locked_by: str,
    batch: int,
    skip_agents: Iterable[str] = (),
) -> BudgetedClaim:
    """Claim up to `batch` steps of the plan's agents (less `skip_agents`) under their budgets
    (see the module docstring)."""
    agents = set(plan.agents) - set(skip_agents)
    if not agents:
        return BudgetedClaim()
    locked: list[Limit] = []
    admitted_at: dict[str, datetime | None] = {}
    if plan.limits_of(agents):
        locked, admitted_at = rows.lock_limits(conn, sorted(agents))
    state = read_budgets(conn, plan, locked, agents)
    t = state.at.timestamp()
    exhausted = exhausted_budgets(state.budgets, t)
    excluded, open_agents = _excluded(state, exhausted, agents)
    if not open_agents:
        return BudgetedClaim(
            due=_due(state, Admission(budgets=state.budgets), t, None), limited=True
        )
    window, whole = _window(state, open_agents, batch, t)
    if whole and not excluded and len(open_agents) == 1:
        # Every budget covers the whole agent and admits the window: the plain claim's one
        # statement, for this agent, takes it.
        claimed, backoff = claim(
            conn,
            locked_by=locked_by,
            batch=window,
            only_agents=sorted(open_agents),
            at=state.at,
            learn_due=False,
        )
        found: Sequence[Any] = claimed
        admission = admit(
            [Candidate(c.id, draws(state, c, ())) for c in claimed], state.budgets, t, window
        )
    else:
        keys = sorted({lim.key for lim in state.limits.values() if lim.key is not None}, key=str)
        found = _candidates(conn, sorted(open_agents), excluded, keys, window)
        chosen = [Candidate(r.id, draws(state, r, keys)) for r in found]
        admission = admit(chosen, state.budgets, t, batch)
        claimed, backoff = [], None
        if admission.admitted:
            claimed, backoff = claim_chosen(
                conn, admission.admitted, locked_by=locked_by, at=state.at
            )
    if claimed:
        _write(conn, state, admission, admitted_at)
    return BudgetedClaim(
        claimed=claimed,
        due=_due(state, admission, t, backoff),
        # More may be admitted now: the candidates filled the batch, or held some back while
        # others beyond them may be admissible.
        full=len(found) == window and bool(claimed) and (window == batch or bool(admission.held)),
        limited=bool(exhausted) or _full(admission),
        admitted=_per_name(admission.drawn.items()),
        held=_per_name((key, 1) for key in admission.held.values()),
        tokens={
            name: budget.gcra.tokens(t)
            for (name, key), budget in admission.budgets.items()
            if budget.gcra is not None and key == "" and state.limits[name].key is None
        },
    )


def _candidates(
    conn: Connection,
    agents: Sequence[str],
    excluded: Sequence[Excluded],
    keys: Sequence[KeyExpr],
    window: int,
) -> Sequence[Any]:
    """Up to `window` candidates in claim order over `agents`: each agent's first `window`
    (one statement each, served by its own index range), merged; the rows past the window stay
    locked until the commit, unclaimed."""
    found: list[Any] = []
    for agent in agents:
        found += conn.execute(candidates(agent, tuple(excluded), tuple(keys), window)).all()
    if len(agents) > 1:
        found.sort(key=lambda r: (-r.priority, r.not_before, r.id))
    return found[:window]


def _per_name(counts: Iterable[tuple[BudgetKey, int]]) -> dict[str, int]:
    found: dict[str, int] = {}
    for (name, _), n in counts:
        found[name] = found.get(name, 0) + n
    return found


def _full(admission: Admission) -> bool:
    """Whether a concurrency budget has no room left after the claim (or held a step)."""
    if admission.held:
        return True
    return any(b.room is not None and b.room <= 0 for b in admission.budgets.values())


def _window(state: Budgets, agents: set[str], batch: int, t: float) -> tuple[int, bool]:
    """How many candidates to lock: a batch, less when the budgets that cover whole agents
    (no key, every action) admit fewer (a rate limit's next call, say, locks one row); and
    whether those budgets are all there is and admit the whole window whatever its agents (one
    agent, or each with room for a batch)."""
    most = dict.fromkeys(agents, batch)
    whole = True
    for (name, key), budget in state.budgets.items():
        family = state.families[name]
        if family.selector.agent not in most:
            continue
        if key == "" and family.key is None and family.selector.actions is None:
            most[family.selector.agent] = budget.capacity(t, most[family.selector.agent])
        else:
            whole = False
    if any(f.key is not None for f in state.families.values() if f.selector.agent in most):
        whole = False
    window = max(1, min(batch, sum(most.values())))
    return window, whole and (len(most) == 1 or min(most.values()) >= batch)


def _excluded(
    state: Budgets, exhausted: dict[BudgetKey, str], agents: set[str]
) -> tuple[list[Excluded], set[str]]:
    """What the candidates leave out (the steps of the budgets that admit nothing now), and
    the agents left with steps to look at."""
    whole: list[Selector] = []
    keyed: dict[str, list[str]] = {}
    for name, key in exhausted:
        family = state.families[name]
        if family.key is None:
            whole.append(family.selector)
        else:
            keyed.setdefault(name, []).append(key)
    open_agents = agents - {s.agent for s in whole if s.actions is None}
    excluded = [Excluded(s) for s in whole if s.agent in open_agents]
    for name, keys in sorted(keyed.items()):
        family = state.families[name]
        if family.selector.agent in open_agents:
            excluded.append(Excluded(family.selector, family.key, tuple(sorted(keys))))
    return excluded, open_agents


def _write(
    conn: Connection,
    state: Budgets,
    admission: Admission,
    admitted_at: Mapping[str, datetime | None],
) -> None:
    """The admitted steps' buckets, and when their limits last admitted (at most once a
    second each: `last_admitted_at` is for people, and its write would cost every claim)."""
    tats = {}
    for key in admission.drawn:
        budget = admission.budgets[key]
        if budget.gcra is not None:
            tats[key] = datetime.fromtimestamp(budget.gcra.tat, UTC)
    rows.write_buckets(conn, tats)
    stale = state.at - ADMITTED_PRECISION
    names = {name for name, _ in admission.drawn if name in state.limits}
    rows.mark_admitted(
        conn,
        sorted(
            n for n in names if (admitted_at.get(n) or datetime.min.replace(tzinfo=UTC)) < stale
        ),
        state.at,
    )


def _due(state: Budgets, admission: Admission, t: float, backoff: float | None) -> float | None:
    waits = [w for w in (admission.wait(t), backoff) if w is not None]
    waits += [(until - state.at).total_seconds() for until in state.opens]
    if not waits:
        return None
    return max(MIN_WAIT, min(waits))
