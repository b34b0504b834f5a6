"""The refusal threshold of the acquisition: how many schedules a scheduler may hold."""

from __future__ import annotations

from dataclasses import dataclass


def hold_limit(active: int, live: int, fault_tolerance: int) -> int:
    """N = 1 + K // max(S - n, 1): with K active schedules and S live schedulers, a scheduler of
    fault tolerance n holds at most N, so that the other S - n can absorb what it holds."""
    if active < 0 or live < 0 or fault_tolerance < 1:
        raise ValueError(f"invalid K={active}, S={live}, n={fault_tolerance}")
    return 1 + active // max(live - fault_tolerance, 1)


@dataclass(frozen=True)
class Load:
    """One scheduler's figures: K active schedules, S live schedulers, its limit N, and X held."""

    active: int
    live: int
    limit: int
    held: int
