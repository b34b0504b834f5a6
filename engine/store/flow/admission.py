"""Which candidate steps a claim admits under its budgets: a pure function of the candidates (in
claim order) and the budgets they draw from, unit-tested without a database.

A budget is one limit for one key (or an implicit bound: an agent's fleet capacity, a breaker's
hold): room for steps in flight (concurrency) and a GCRA rate state. GCRA, the generic cell rate
algorithm: with the emission interval T = 1/rate and the tolerance tau = burst * T, a call at
time t conforms iff max(tat, t) + T - t <= tau, and then moves the theoretical arrival time
`tat` to max(tat, t) + T. One timestamp per budget, no refill loop: after an idle period a
budget holds `burst` calls, then one every T.

Candidates are taken in order (the claim's: priority, then readiness, then id); a candidate is
admitted only if every budget it draws from has room and conforms, and then draws from all of
them; otherwise it is held with the reason of the first budget that refused it, and draws from
none. Nothing is admitted beyond any budget, and a held candidate costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from sasflow.store.flow.model import Limit, format_rate

EPSILON = 1e-6
"""Seconds GCRA forgives: the database clock's resolution (a call exactly on time conforms
despite float rounding, and a `tat` stored to the microsecond)."""

BudgetKey = tuple[str, str]
"""(limit name or implicit bound, key): '' when the limit has no key."""


@dataclass(frozen=True)
class Gcra:
    """A rate budget's state at the claim: `tat` in seconds on the database clock (epoch)."""

    interval: float
    tolerance: float
    tat: float

    @staticmethod
    def of(rate: float, burst: int, tat: datetime | None) -> Gcra:
        interval = 1.0 / rate
        return Gcra(interval, burst * interval, tat.timestamp() if tat is not None else 0.0)

    def conforms(self, t: float) -> bool:
        return max(self.tat, t) + self.interval - t <= self.tolerance + EPSILON

    def take(self, t: float) -> Gcra:
        return replace(self, tat=max(self.tat, t) + self.interval)

    def wait(self, t: float) -> float:
        """Seconds from `t` until one call conforms (0.0: now)."""
        return max(0.0, self.tat + self.interval - self.tolerance - t)

    def tokens(self, t: float) -> float:
        """Calls that conform at `t` one after the other (fractional: part of the next)."""
        return max(0.0, (self.tolerance - max(0.0, self.tat - t)) / self.interval)


@dataclass(frozen=True)
class Budget:
    """What one budget allows at the claim, and what it says when it holds a step."""

    room: int | None = None
    """Steps it may still admit (its concurrency less the steps in flight); None: no bound."""
    gcra: Gcra | None = None
    concurrency_reason: str = ""
    rate_reason: str = ""

    def refusal(self, t: float) -> str | None:
        """Why it admits no step at `t`, or None when it admits one."""
        if self.room is not None and self.room <= 0:
            return self.concurrency_reason
        if self.gcra is not None and not self.gcra.conforms(t):
            return self.rate_reason
        return None

    def rate_refuses(self, t: float) -> bool:
        """Whether its rate alone refuses a step at `t` (it conforms again at `gcra.wait`)."""
        return self.gcra is not None and not self.gcra.conforms(t)

    def capacity(self, t: float, most: int) -> int:
        """Steps it would admit at `t` one after the other, at most `most`."""
        found = most if self.room is None else min(most, max(0, self.room))
        if self.gcra is not None:
            found = min(found, int(self.gcra.tokens(t) + EPSILON))
        return found

    def take(self, t: float) -> Budget:
        return replace(
            self,
            room=None if self.room is None else self.room - 1,
            gcra=None if self.gcra is None else self.gcra.take(t),
        )


def limit_budget(limit: Limit, key: str, *, in_flight: int, tat: datetime | None) -> Budget:
    """The budget of `limit` for `key` with `in_flight` of its steps processing and its bucket's
    `tat` (None: no bucket row, a full burst)."""
    suffix = f" (key {key})" if limit.key is not None else ""
    concurrency = ""
    if limit.concurrency is not None:
        concurrency = (
            f"paused: {limit.name} (concurrency 0)"
            if limit.concurrency == 0
            else f"concurrency: {limit.name} {limit.concurrency} at once{suffix}"
        )
    return Budget(
        room=None if limit.concurrency is None else limit.concurrency - in_flight,
        gcra=None if limit.rate is None else Gcra.of(limit.rate, limit.effective_burst, tat),
        concurrency_reason=concurrency,
        rate_reason=""
        if limit.rate is None
        else f"rate-limited: {limit.name} {format_rate(limit.rate)}{suffix}",
    )


@dataclass(frozen=True)
class Candidate:
    """A ready step the claim may admit, and the budgets it would draw from."""

    id: int
    budgets: tuple[BudgetKey, ...]


@dataclass
class Admission:
    admitted: list[int] = field(default_factory=list)
    """In claim order."""
    held: dict[int, BudgetKey] = field(default_factory=dict)
    """Candidate id -> the first budget that refused it."""
    reasons: dict[int, str] = field(default_factory=dict)
    """Candidate id -> why it is held (that budget's reason)."""
    budgets: dict[BudgetKey, Budget] = field(default_factory=dict)
    """The budgets after the admitted steps drew from them (their new `tat`s)."""
    drawn: dict[BudgetKey, int] = field(default_factory=dict)
    """Steps admitted per budget."""

    def wait(self, t: float) -> float | None:
        """Seconds until the earliest budget whose rate refuses a step now conforms again
        (None: no rate refuses one)."""
        return earliest_wait(self.budgets.values(), t)


def admit(
    candidates: Iterable[Candidate], budgets: Mapping[BudgetKey, Budget], t: float, want: int
) -> Admission:
    """Admit candidates in order, at most `want`, at `t` (seconds on the database clock), none
    beyond any of its budgets (see the module docstring). A candidate naming a budget missing
    from `budgets` draws from nothing there."""
    done = Admission(budgets=dict(budgets))
    current = done.budgets
    for candidate in candidates:
        if len(done.admitted) >= want:
            break
        reason = None
        for key in candidate.budgets:
            budget = current.get(key)
            if budget is not None:
                reason = budget.refusal(t)
                if reason is not None:
                    break
        if reason is not None:
            done.held[candidate.id] = key
            done.reasons[candidate.id] = reason
            continue
        done.admitted.append(candidate.id)
        for key in candidate.budgets:
            budget = current.get(key)
            if budget is not None:
                current[key] = budget.take(t)
                done.drawn[key] = done.drawn.get(key, 0) + 1
    return done


def exhausted(budgets: Mapping[BudgetKey, Budget], t: float) -> dict[BudgetKey, str]:
    """The budgets that admit no step at `t`, with their reasons: the claim leaves their
    steps out of its candidates (so a long queue of one key does not hide the others)."""
    found = {}
    for key, budget in budgets.items():
        reason = budget.refusal(t)
        if reason is not None:
            found[key] = reason
    return found


def earliest_wait(budgets: Iterable[Budget], t: float) -> float | None:
    """Seconds until the first of the budgets whose rate refuses a step at `t` conforms again
    (None: no rate refuses one)."""
    waits = [b.gcra.wait(t) for b in budgets if b.gcra is not None and not b.gcra.conforms(t)]
    return min(waits, default=None)
