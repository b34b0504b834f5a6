"""The chaos suite's CI form: a few hundred runs under every fault type, a few minutes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.faults import ALL_FAULTS
from tests.chaos.runner import ChaosConfig, run

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_every_invariant_holds_under_the_seeded_fault_schedule(tmp_path: Path) -> None:
    """300 runs through 2 schedulers, 4 agents and 2 supervisors while processes are killed
    and stopped, RabbitMQ and PostgreSQL restarted and poison injected: no run lost, no
    double effect, no stale completion, nothing stuck, no crash loop, all poison
    dead-lettered with a reason."""
    report = run(
        ChaosConfig(runs=300, seed=1, duration=100, heal_timeout=120, logs=tmp_path / "logs")
    )
    assert report.figures["missing_fault_types"] == [], "a fault type was never injected"
    assert sum(report.figures["faults"].values()) >= len(ALL_FAULTS)
    assert report.violations == [], report.text()
