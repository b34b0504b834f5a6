"""The chaos suite's CI form: a few hundred runs under every fault type, a few minutes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.faults import ALL_FAULTS
from tests.chaos.instances import unavailable
from tests.chaos.runner import ChaosConfig, run
from tests.cluster.__main__ import TEST_CLUSTER

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_every_invariant_holds_under_the_seeded_fault_schedule(tmp_path: Path) -> None:
    """300 runs through 2 schedulers, 4 agents and 2 supervisors while processes are killed
    and stopped, RabbitMQ and PostgreSQL restarted and poison injected: no run lost, no
    double effect, no stale completion, nothing stuck, no crash loop, all poison
    dead-lettered with a reason; steps longer than the broker's consumer timeout complete,
    no attempt of theirs run twice."""
    report = run(
        ChaosConfig(runs=300, seed=1, duration=100, heal_timeout=120, logs=tmp_path / "logs")
    )
    assert report.figures["missing_fault_types"] == [], "a fault type was never injected"
    assert sum(report.figures["faults"].values()) >= len(ALL_FAULTS)
    assert report.violations == [], report.text()


@pytest.mark.cluster
@pytest.mark.cluster_long
@pytest.mark.timeout(900)
def test_every_invariant_holds_on_the_cluster(tmp_path: Path) -> None:
    """200 runs on the local cluster (quorum queues on three RabbitMQ nodes, a PostgreSQL
    primary and its synchronous standby) while the nodes leading the work queues are killed,
    queues deleted under their consumers and the standby promoted: the same invariants."""
    running = os.environ.get(TEST_CLUSTER)
    if not running and (why := unavailable()) is not None:
        pytest.skip(f"no local cluster: {why}")
    report = run(
        ChaosConfig(
            runs=200,
            seed=1,
            duration=90,
            heal_timeout=120,
            logs=tmp_path / "logs",
            cluster=True,
            cluster_dir=Path(running) if running else None,
        )
    )
    assert report.figures["missing_fault_types"] == [], "a fault type was never injected"
    assert report.violations == [], report.text()
