"""The per-agent in-flight bound's bookkeeping (engine/scheduler/inflight.py)."""

from __future__ import annotations

from sasflow.scheduler.inflight import InFlightCap


def test_no_limit_never_counts() -> None:
    cap = InFlightCap(None)
    cap.dispatched("a", 10_000)
    assert not cap.needs_count(100)


def test_counts_only_when_a_claim_could_pass_the_limit() -> None:
    cap = InFlightCap(10)
    assert not cap.needs_count(5)
    cap.dispatched("a", 5)
    assert not cap.needs_count(5)  # 5 + 5 reaches the limit, does not pass it
    cap.dispatched("a")
    assert cap.needs_count(5)


def test_agents_at_the_limit_are_left_out_until_a_count_shows_room() -> None:
    cap = InFlightCap(10)
    assert cap.counted({"a": 10, "b": 3, "c": 12}) == ["a", "c"]
    assert cap.capped
    assert cap.counted({"a": 9, "b": 3}) == []
    assert not cap.capped
    assert cap.needs_count(2)  # a: 9 + 2 > 10
    assert not cap.needs_count(1)


def test_every_agent_capped_means_no_claim_at_all() -> None:
    cap = InFlightCap(10)
    cap.counted({"a": 10, "b": 3})
    assert not cap.all_capped(["a", "b"])
    cap.counted({"a": 10, "b": 11})
    assert cap.all_capped(["a", "b"])
    assert not cap.all_capped(["a", "b", "c"])  # c has room
    assert not InFlightCap(None).all_capped(["a"])
