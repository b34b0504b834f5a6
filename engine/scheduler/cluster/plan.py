"""The scope strategy's plan: which scheduler covers which range of schedules (pure, no I/O).

A plan maps the active schedules, ordered by id and numbered 1..K, onto the plan's members
(live schedulers, ordered by address). `Planner` is the interface; `EvenRanges` is the plan
of docs/cluster.md: each member gets K // S consecutive schedules and the last one also the
remainder. Another plan (weighted, say) can be added behind the same interface.

Each range is stored with the schedule ids it covers, `lo_id..hi_id`, contiguous over the
plan (the first range unbounded below, the last unbounded above): a schedule added between
two reshards is covered at once (by the last range, ids only grow) until the leader re-plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Member:
    """A scheduler the plan can give schedules to."""

    id: str
    """Its registration id."""
    name: str
    address: str


@dataclass(frozen=True)
class PlannedRange:
    """One member's share: positions `first..last` (1-based; empty when last < first) of the
    schedules ordered by id, and the ids it covers (None: unbounded)."""

    member: Member
    position: int
    first: int
    last: int
    lo_id: int | None
    hi_id: int | None

    @property
    def size(self) -> int:
        return max(0, self.last - self.first + 1)

    def covers(self, schedule_id: int) -> bool:
        return (self.lo_id is None or schedule_id >= self.lo_id) and (
            self.hi_id is None or schedule_id <= self.hi_id
        )


class Planner(Protocol):
    """Computes a plan from the active schedule ids (ascending) and the members (in order)."""

    def plan(self, ids: Sequence[int], members: Sequence[Member]) -> list[PlannedRange]: ...


def even_ranges(active: int, members: int) -> list[tuple[int, int]]:
    """Positions (first, last) of each of `members` ranges over 1..`active`: K // S each, the
    last one also the remainder (K=2300, S=3: (1, 766), (767, 1532), (1533, 2300))."""
    if active < 0 or members < 0:
        raise ValueError(f"invalid K={active}, S={members}")
    if members == 0:
        return []
    share = active // members
    ranges = [(i * share + 1, (i + 1) * share) for i in range(members - 1)]
    ranges.append(((members - 1) * share + 1, active))
    return ranges


class EvenRanges:
    """K // S consecutive schedules per member, the last one also the remainder."""

    def plan(self, ids: Sequence[int], members: Sequence[Member]) -> list[PlannedRange]:
        planned: list[PlannedRange] = []
        hi: int | None = None
        for position, (member, (first, last)) in enumerate(
            zip(members, even_ranges(len(ids), len(members)), strict=True), start=1
        ):
            lo = None if position == 1 else (hi or 0) + 1
            # ids start at 1, so 0 bounds a range that covers nothing.
            hi = None if position == len(members) else (ids[last - 1] if last >= 1 else 0)
            planned.append(PlannedRange(member, position, first, last, lo, hi))
        return planned
