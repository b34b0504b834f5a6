"""The scope strategy's plan (scheduler/cluster/plan.py): K // S consecutive schedules per
scheduler, the last one also the remainder, and the id bounds that cover every schedule exactly
once."""

from __future__ import annotations

import pytest

from sasflow.scheduler.cluster.plan import EvenRanges, Member, even_ranges


def test_the_issue_example() -> None:
    assert even_ranges(2300, 3) == [(1, 766), (767, 1532), (1533, 2300)]


@pytest.mark.parametrize(
    ("active", "members", "expected"),
    [
        (0, 3, [(1, 0), (1, 0), (1, 0)]),  # K = 0: every range empty
        (2, 3, [(1, 0), (1, 0), (1, 2)]),  # K < S: the last one takes the remainder
        (5, 1, [(1, 5)]),  # S = 1: one range, everything
        (0, 1, [(1, 0)]),
        (6, 3, [(1, 2), (3, 4), (5, 6)]),
        (7, 3, [(1, 2), (3, 4), (5, 7)]),
        (3, 0, []),  # no scheduler: no plan
    ],
)
def test_edge_cases(active: int, members: int, expected: list[tuple[int, int]]) -> None:
    ranges = even_ranges(active, members)
    assert ranges == expected
    assert sum(max(0, last - first + 1) for first, last in ranges) == (active if members else 0)


def test_negative_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="invalid"):
        even_ranges(-1, 2)


def members(count: int) -> list[Member]:
    return [Member(f"r{i}", f"s{i}", f"host{i}") for i in range(1, count + 1)]


@pytest.mark.parametrize(("active", "count"), [(2300, 3), (0, 3), (2, 3), (5, 1), (0, 1)])
def test_id_bounds_cover_each_schedule_exactly_once_and_new_ones_go_to_the_last(
    active: int, count: int
) -> None:
    ids = [10 + 3 * i for i in range(active)]  # ids with gaps (removed schedules)
    plan = EvenRanges().plan(ids, members(count))
    assert [r.member.name for r in plan] == [f"s{i}" for i in range(1, count + 1)]
    for position, schedule_id in enumerate(ids, start=1):
        covering = [r for r in plan if r.covers(schedule_id)]
        assert len(covering) == 1
        assert covering[0].first <= position <= covering[0].last
    added = (ids[-1] if ids else 0) + 1
    assert [r.position for r in plan if r.covers(added)] == [count]
    assert plan[0].lo_id is None
    assert plan[-1].hi_id is None


def test_sizes_follow_the_formula() -> None:
    plan = EvenRanges().plan(list(range(1, 2301)), members(3))
    assert [(r.first, r.last, r.size) for r in plan] == [
        (1, 766, 766),
        (767, 1532, 766),
        (1533, 2300, 768),
    ]
    assert [(r.lo_id, r.hi_id) for r in plan] == [(None, 766), (767, 1532), (1533, None)]
