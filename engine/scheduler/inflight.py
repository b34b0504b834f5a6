"""The bound on steps a scheduler has in flight per agent (dispatched, no reply applied yet).

Without it a scheduler claims everything ready at once: a backlog of 10,000 steps would wait in
the agent's queue with its deadlines already running (a step's `complete_by` starts at its
claim), and on a machine slower than the backlog the tail would expire unanswered. With it, a
step beyond the bound stays `pending` in the database, where its deadline has not started and
any scheduler may claim it later.

Which scheduler applies a reply is up to the broker (one reply queue for all of them), so the
true count lives in the database (`steps` in `processing` locked by this scheduler). Counting
it at every claim would cost a query each; instead the cap keeps, per agent, an upper bound of
that count (the last count plus what was dispatched since; replies only lower the true count)
and counts again only when a claim could take an agent past the bound. An agent at the bound
is left out of the next claim; others are claimed as before, so a slow agent does not hold
back a fast one. When every agent is at the bound there is no claim at all: the claim would
walk every pending step only to skip them. When some are, a claim walks past the pending steps
of those ahead of the others' in priority order (its cost grows with their backlog). One claim
may overshoot by less than its batch: a scheduler holds at most `limit + claim_batch - 1` steps
of one agent in flight.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class InFlightCap:
    """Per-agent upper bounds of the steps this scheduler has in flight (see module doc)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._bounds: dict[str, int] = {}
        self.capped = False
        """The last claim left an agent out: a reply applied may make room, so claim again."""
        self.left_out: list[str] = []
        """The agents the last count found at the limit (a budgeted claim without a count of
        its own leaves them out too)."""

    def needs_count(self, batch: int) -> bool:
        """Whether a claim of `batch` steps could take an agent past the limit."""
        if self.limit is None:
            return False
        return any(bound + batch > self.limit for bound in self._bounds.values())

    def counted(self, counts: Mapping[str, int]) -> list[str]:
        """Take the database's counts (agent -> steps in flight); returns the agents at the
        limit, to leave out of this claim."""
        self._bounds = {agent: n for agent, n in counts.items() if n > 0}
        full = sorted(
            a for a, n in self._bounds.items() if self.limit is not None and n >= self.limit
        )
        self.capped = bool(full)
        self.left_out = full
        return full

    def all_capped(self, agents: Iterable[str]) -> bool:
        """Whether every one of `agents` was at the limit at the last count."""
        if not self.capped or self.limit is None:
            return False
        limit = self.limit
        return all(self._bounds.get(agent, 0) >= limit for agent in agents)

    def dispatched(self, agent: str, count: int = 1) -> None:
        self._bounds[agent] = self._bounds.get(agent, 0) + count
