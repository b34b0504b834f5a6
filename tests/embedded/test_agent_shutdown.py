"""An agent that stops with all its work done leaves no thread behind: the CLI counts every
non-daemon thread alive at exit as a hung handler ("exiting with N handler threads still
running"), so idle pool threads must be gone by then, and only a handler still running counts."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from sasflow.agents import Agent, Call
from sasflow.agents.worker import AgentWorker
from sasflow.messages import Request
from sasflow.transport.base import Outgoing
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.topology import Names, declare_agent_queue, declare_common

CONCURRENCY = 4


@pytest.fixture
def names() -> Names:
    return Names(f"sfstop_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def app(names: Names) -> Iterator[MemoryTransport]:
    transport = MemoryTransport(MemoryBroker(), process_name="app")
    transport.connect()
    declare_common(transport, names)
    yield transport
    transport.close()


def _agent(release: threading.Event, together: threading.Barrier) -> Agent:
    agent = Agent(f"stopper{uuid.uuid4().hex[:8]}")

    @agent.handler("together")
    def meet(_call: Call) -> dict[str, Any]:
        together.wait()  # every pool thread not hanging is started and runs a handler
        return {}

    @agent.handler("hang")
    def hang(_call: Call) -> dict[str, Any]:
        release.wait(10)  # ignores its deadline: abandoned, and still running at exit
        return {}

    return agent


class SlowWakeTransport(MemoryTransport):
    """A handler thread's wake-up call to the owner takes a while (as when the owner thread
    holds the GIL): the thread is still finishing its work item when the owner, which polls
    anyway, has replied, drained and returned from `run()`."""

    def call_threadsafe(self, callback: Callable[[], None]) -> None:
        time.sleep(0.8)
        super().call_threadsafe(callback)


def _request(agent: Agent, step_id: int, action: str, budget_ms: int) -> Request:
    return Request(
        step_id=step_id,
        run_id=1,
        attempt=1,
        workflow="w",
        step=f"s{step_id}",
        agent=agent.name,
        action=action,
        idempotency_key=f"k{step_id}",
        budget_ms=budget_ms,
        complete_by=datetime.now(UTC).isoformat(),
    )


def _left_running(app: MemoryTransport, names: Names, actions: list[tuple[str, int]]) -> int:
    """Serve `actions`, stop once each was replied to or abandoned, and count the non-daemon
    threads still alive the moment `run()` returned (what the CLI then counts)."""
    release = threading.Event()
    meeting = sum(1 for action, _ in actions if action == "together")
    agent = _agent(release, threading.Barrier(meeting, timeout=5))
    declare_agent_queue(app, names, agent.name)
    broker = app._broker
    worker = AgentWorker(
        agent,
        SlowWakeTransport(broker, process_name="agent"),
        names,
        concurrency=CONCURRENCY,
    )
    before = set(threading.enumerate())
    # Not a daemon, as the CLI's main thread: the pool's threads inherit that from it.
    role = threading.Thread(target=worker.run, daemon=False)
    role.start()
    try:
        for step_id, (action, budget_ms) in enumerate(actions, start=1):
            request = _request(agent, step_id, action, budget_ms)
            app.publish(Outgoing("", names.agent(agent.name), request.encode()))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stats = worker.stats
            if stats.replied_ok + stats.abandoned == len(actions):
                break
            time.sleep(0.01)
        worker.stop_event.set()
        role.join(10)
        assert not role.is_alive()
        return len([t for t in set(threading.enumerate()) - before if not t.daemon])
    finally:
        release.set()


def test_an_agent_that_finished_its_work_leaves_no_handler_thread_running(
    app: MemoryTransport, names: Names
) -> None:
    left = _left_running(app, names, [("together", 10_000)] * CONCURRENCY)
    assert left == 0


def test_only_a_handler_still_running_past_its_deadline_is_left_at_exit(
    app: MemoryTransport, names: Names
) -> None:
    actions = [("hang", 300)] + [("together", 10_000)] * (CONCURRENCY - 1)
    left = _left_running(app, names, actions)
    assert left == 1
