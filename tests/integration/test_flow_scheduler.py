"""Flow limits with real schedulers and agents: at most the limit runs at once, counted where
the handlers run; a change made through the operators' service takes effect within the
schedulers' refresh; a rate paces the steps started; an agent with no live instance gets no
step until one is back, and its steps wait uncharged meanwhile."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.ops import limits as limit_ops
from sasflow.ops import runs as run_ops
from sasflow.store.flow.model import Limit
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration


class Gauge:
    """Handlers running at once, as the agent sees them."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


def _app(gate: threading.Event, gauge: Gauge) -> tuple[Registry, Agent]:
    busy = Agent("busy")

    @busy.handler("work")
    def work(call: Call) -> None:
        gauge.enter()
        try:
            gate.wait(call.remaining())
        finally:
            gauge.leave()

    policy = StepPolicy(timeout=60)
    return Registry([Workflow("work", [Step("only", "busy", "work", policy=policy)])], [busy]), busy


def _submit(engine: Engine, registry: Registry, names: Names, count: int, prefix: str) -> list[int]:
    with engine.begin() as conn:
        return [
            submit_run(
                conn, registry, "work", {}, key=f"{prefix}{i}", namespace=names.namespace
            ).run_id
            for i in range(count)
        ]


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def _set(engine: Engine, names: Names, limit: Limit) -> None:
    with engine.begin() as conn:
        limit_ops.set_limit(conn, limit, actor="test", reason="test", namespace=names.namespace)


@pytest.fixture
def gated() -> Iterator[tuple[threading.Event, Gauge]]:
    gate = threading.Event()
    yield gate, Gauge()
    gate.set()


def test_a_concurrency_limit_holds_across_two_schedulers_and_changes_at_run_time(
    engine: Engine, database_url: str, names: Names, gated: tuple[threading.Event, Gauge]
) -> None:
    gate, gauge = gated
    registry, busy = _app(gate, gauge)
    _set(engine, names, Limit("busy-two", "busy", concurrency=2))
    run_ids = _submit(engine, registry, names, 12, "w")
    schedulers = [harness.scheduler(engine, database_url, registry, names) for _ in range(2)]
    with harness.running(*schedulers, harness.agent(busy, names, concurrency=10)):
        harness.wait_for(lambda: gauge.now == 2, what="two steps running")
        time.sleep(1.0)  # room for a wrong third one to arrive
        assert (
            gauge.most,
            _count(engine, "SELECT count(*) FROM steps WHERE state='processing'"),
        ) == (2, 2)
        with engine.connect() as conn:
            detail = run_ops.show_run(conn, run_ids[-1])
        assert detail["steps"][0]["waiting"] == "concurrency: busy-two 2 at once"
        _set(engine, names, Limit("busy-two", "busy", concurrency=5))
        harness.wait_for(lambda: gauge.now == 5, timeout=5, what="five steps running")
        time.sleep(0.5)
        assert gauge.most == 5
        gate.set()
        harness.wait_for(
            lambda: _count(engine, "SELECT count(*) FROM runs WHERE state='completed'") == 12,
            what="every run completed",
        )
    assert _count(engine, "SELECT coalesce(sum(failure_count), 0) FROM steps") == 0


def test_a_rate_limit_paces_the_steps_started(
    engine: Engine, database_url: str, names: Names, gated: tuple[threading.Event, Gauge]
) -> None:
    """10 per second with a burst of 2: 20 steps take at least 1.8 s to start, spread out."""
    gate, gauge = gated
    gate.set()  # handlers return at once
    registry, busy = _app(gate, gauge)
    _set(engine, names, Limit("busy-rate", "busy", rate=10, burst=2))
    _submit(engine, registry, names, 20, "r")
    with harness.running(
        harness.scheduler(engine, database_url, registry, names), harness.agent(busy, names)
    ):
        harness.wait_for(
            lambda: _count(engine, "SELECT count(*) FROM runs WHERE state='completed'") == 20,
            what="every run completed",
        )
    with engine.connect() as conn:
        spread = conn.execute(
            text("SELECT extract(epoch FROM max(dispatched_at) - min(dispatched_at)) FROM steps")
        ).scalar_one()
    assert float(spread) >= (20 - 2) / 10 - 0.01


def test_an_agent_with_no_live_instance_gets_no_step_until_one_is_back(
    engine: Engine, database_url: str, names: Names, gated: tuple[threading.Event, Gauge]
) -> None:
    gate, gauge = gated
    gate.set()
    registry, busy = _app(gate, gauge)
    scheduler = harness.scheduler(engine, database_url, registry, names)
    with harness.running(scheduler, harness.agent(busy, names)):  # it says hello, then goodbye
        harness.wait_for(
            lambda: _count(engine, "SELECT count(*) FROM agent_instances") == 1,
            what="the agent's heartbeat recorded",
        )
    scheduler = harness.scheduler(engine, database_url, registry, names)
    with harness.running(scheduler):
        harness.wait_for(
            lambda: (
                _count(engine, "SELECT count(*) FROM agent_instances WHERE state='stopped'") == 1
            ),
            what="the agent's goodbye recorded",
        )
        run_ids = _submit(engine, registry, names, 3, "g")
        time.sleep(2.5)  # claims and refreshes happen; the agent is gone
        assert (
            _count(engine, "SELECT count(*) FROM steps WHERE state = 'pending' AND attempt = 0")
            == 3
        )
        with engine.connect() as conn:
            assert (
                run_ops.show_run(conn, run_ids[0])["steps"][0]["waiting"]
                == "no live agent instance"
            )
        started = time.monotonic()
        with harness.running(harness.agent(busy, names)):
            harness.wait_for(
                lambda: _count(engine, "SELECT count(*) FROM runs WHERE state='completed'") == 3,
                timeout=10,
                what="the runs completed once the agent is back",
            )
        back_in = time.monotonic() - started
    assert back_in < 5.0  # within one heartbeat interval of the agent's return
    assert _count(engine, "SELECT coalesce(sum(failure_count), 0) FROM steps") == 0
