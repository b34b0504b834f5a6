"""Flow limits' metrics: the scheduler's admitted steps and tokens (through the hook seam) and
the supervisor's gauge of held steps (read on a scrape, at most every few seconds)."""

from __future__ import annotations

from sasflow.errors import StoreUnavailableError
from sasflow.hooks import HookChain
from sasflow.observability.exposition import new_registry
from sasflow.observability.metrics import LimitGauges, SchedulerMetrics


def test_the_budgeted_claim_counts_admitted_steps_and_sets_tokens_per_limit() -> None:
    registry = new_registry()
    hooks = HookChain([SchedulerMetrics(registry)])
    hooks.steps_budgeted({"payments": 3, "fleet:pay": 3}, {"payments": 7}, {"payments": 0.5})
    hooks.steps_budgeted({"payments": 2}, {}, {"payments": 1.5})
    value = registry.get_sample_value
    assert value("sasflow_limit_admitted_total", {"limit": "payments"}) == 5
    assert value("sasflow_limit_admitted_total", {"limit": "fleet:pay"}) == 3
    assert value("sasflow_limit_tokens", {"limit": "payments"}) == 1.5


def test_held_steps_are_read_on_a_scrape_at_most_every_interval() -> None:
    reads: list[int] = []

    def read() -> dict[str, int]:
        reads.append(1)
        if len(reads) == 3:
            raise StoreUnavailableError("away")
        return {"payments": 12 + len(reads)}

    registry = new_registry()
    registry.register(LimitGauges(read, min_interval=0.0))
    assert registry.get_sample_value("sasflow_limit_held_steps", {"limit": "payments"}) == 13
    assert registry.get_sample_value("sasflow_limit_held_steps", {"limit": "payments"}) == 14
    assert registry.get_sample_value("sasflow_limit_held_steps", {"limit": "payments"}) is None
    cached = new_registry()
    cached.register(LimitGauges(lambda: {"a": len(reads)}, min_interval=3600))
    first = cached.get_sample_value("sasflow_limit_held_steps", {"limit": "a"})
    reads.append(1)
    assert cached.get_sample_value("sasflow_limit_held_steps", {"limit": "a"}) == first
