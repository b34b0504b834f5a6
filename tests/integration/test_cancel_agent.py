"""A cancel reaches the agent holding the step, on the real services: the run's cancel records the
step `cancelled` and the relay sends a fenced `Cancel` to the agent's instances; the one running
that attempt tells its handler (`call.cancelled`), stops its programs (SIGTERM, SIGKILL after
the grace) and sends no reply; no failure is counted. A cancel of an earlier attempt changes
nothing, and a cancel made while no relay could publish it goes out later, and one published
while the agent process reconnects reaches it once it is back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import Engine, select, update

from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.agents.children import DEFAULT_GRACE, ChildProcesses, start_ticks
from sasflow.agents.worker import AgentOptions, AgentWorker
from sasflow.messages import Cancel
from sasflow.ops.cancel import cancel
from sasflow.store.schema import events, runs, steps
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names
from tests import harness, services
from tests.proxy import Proxy, closed_port, url_through

pytestmark = pytest.mark.integration

GRACE = DEFAULT_GRACE
"""The handler's grace between SIGTERM and SIGKILL of its program (the default, 5 s): the
acceptance is a program stopped within it, counted from the cancel's commit (the relay's next
pass, within its 1 s interval, carries the cancel)."""


class Seen:
    """What the handlers saw, shared with the test thread."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.returned = threading.Event()
        self.release = threading.Event()
        self.raised: list[str] = []
        self.calls: list[Call] = []


@pytest.fixture
def seen() -> Iterator[Seen]:
    found = Seen()
    yield found
    found.release.set()


def _registry(seen: Seen) -> tuple[Registry, Agent]:
    agent = Agent("worker")

    @agent.handler("program")
    def program(call: Call) -> str:
        seen.calls.append(call)
        seen.started.set()
        try:
            call.run(["sleep", "600"], grace=GRACE)
        except Exception as exc:
            seen.raised.append(type(exc).__name__)
            raise
        finally:
            seen.returned.set()
        return "slept"

    @agent.handler("loop")
    def loop(call: Call) -> str:
        seen.calls.append(call)
        seen.started.set()
        while not call.cancelled.wait(0.05) and not seen.release.is_set():
            pass
        seen.returned.set()
        return "stopped early" if call.cancelled.is_set() else "released"

    @agent.handler("wait")
    async def wait(call: Call) -> str:
        seen.calls.append(call)
        seen.started.set()
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            seen.raised.append("CancelledError")
            raise
        finally:
            seen.returned.set()
        return "slept"

    policy = StepPolicy(timeout=120)
    registry = Registry(
        [
            Workflow("prog", [Step("only", "worker", "program", policy=policy)]),
            Workflow("loop", [Step("only", "worker", "loop", policy=policy)]),
            Workflow("wait", [Step("only", "worker", "wait", policy=policy)]),
        ],
        [agent],
    )
    return registry, agent


def _submit(engine: Engine, registry: Registry, names: Names, workflow: str) -> int:
    with engine.begin() as conn:
        return submit_run(conn, registry, workflow, {}, key="k", namespace=names.namespace).run_id


def _cancel(engine: Engine, names: Names, run_id: int) -> None:
    with engine.begin() as conn:
        cancel(conn, run_id, actor="ann", reason="customer asked", namespace=names.namespace)


def _step(engine: Engine, run_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(steps).where(steps.c.run_id == run_id)).one()


def _run_state(engine: Engine, run_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(select(runs.c.state).where(runs.c.id == run_id)).scalar_one())


def _program_pid(state_dir: Path) -> int:
    harness.wait_for(lambda: any(state_dir.glob("*.json")), what="the program's pid file")
    return int(next(state_dir.glob("*.json")).stem)


def _alive(pid: int) -> bool:
    if start_ticks(pid) is None:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    return state != "Z"


def _worker(agent: Agent, names: Names, state_dir: Path) -> AgentWorker:
    return AgentWorker(
        agent,
        harness.transport("agent-worker"),
        names,
        options=AgentOptions(children=ChildProcesses(state_dir)),
    )


def test_a_cancel_stops_a_running_program_within_the_grace_and_the_step_ends_cancelled(
    engine: Engine, database_url: str, names: Names, seen: Seen, tmp_path: Path
) -> None:
    registry, agent = _registry(seen)
    run_id = _submit(engine, registry, names, "prog")
    worker = _worker(agent, names, tmp_path)
    with harness.running(harness.scheduler(engine, database_url, registry, names), worker):
        pid = _program_pid(tmp_path)
        assert _alive(pid)
        _cancel(engine, names, run_id)
        cancelled_at = time.monotonic()
        # Delivery (the relay's next pass, then the broker) takes about a second on a quiet
        # machine; a loaded one (a CI run beside the chaos suite) once took longer than the
        # grace: the bound here is the grace plus room for delivery, the figure is printed.
        harness.wait_for(lambda: not _alive(pid), timeout=GRACE + 10, what="the program stopped")
        stopped_after = time.monotonic() - cancelled_at
        harness.wait_for(seen.returned.is_set, timeout=GRACE, what="the handler returned")
        assert seen.calls[0].cancelled.is_set()
        assert seen.raised == ["ChildKilledError"]
        assert worker.stats.cancelled == 1
        step = _step(engine, run_id)
    print(f"program stopped {stopped_after:.3f}s after the cancel committed")
    assert (step.state, step.failure_count, step.output) == ("cancelled", 0, None)
    assert _run_state(engine, run_id) == "cancelled"
    assert worker.stats.replied_ok + worker.stats.replied_error + worker.stats.replied_failed == 0


def test_a_python_handler_polling_call_cancelled_returns_and_its_output_is_not_applied(
    engine: Engine, database_url: str, names: Names, seen: Seen, tmp_path: Path
) -> None:
    registry, agent = _registry(seen)
    run_id = _submit(engine, registry, names, "loop")
    worker = _worker(agent, names, tmp_path)
    with harness.running(harness.scheduler(engine, database_url, registry, names), worker):
        harness.wait_for(seen.started.is_set, what="the handler started")
        _cancel(engine, names, run_id)
        harness.wait_for(seen.returned.is_set, timeout=10, what="the handler returned")
        assert not seen.release.is_set()
        harness.wait_for(lambda: worker.stats.cancelled == 1, timeout=5, what="counted")
    step = _step(engine, run_id)
    assert (step.state, step.failure_count, step.output) == ("cancelled", 0, None)
    assert worker.stats.replied_ok == 0


def test_an_async_handlers_task_is_cancelled(
    engine: Engine, database_url: str, names: Names, seen: Seen, tmp_path: Path
) -> None:
    registry, agent = _registry(seen)
    run_id = _submit(engine, registry, names, "wait")
    worker = _worker(agent, names, tmp_path)
    with harness.running(harness.scheduler(engine, database_url, registry, names), worker):
        harness.wait_for(seen.started.is_set, what="the handler started")
        _cancel(engine, names, run_id)
        harness.wait_for(seen.returned.is_set, timeout=10, what="the handler returned")
        assert seen.raised == ["CancelledError"]
    step = _step(engine, run_id)
    assert (step.state, step.failure_count, step.output, step.error) == ("cancelled", 0, None, None)
    assert worker.stats.cancelled == 1


def test_a_cancel_of_an_earlier_attempt_is_ignored(
    engine: Engine, database_url: str, names: Names, seen: Seen, tmp_path: Path
) -> None:
    registry, agent = _registry(seen)
    run_id = _submit(engine, registry, names, "loop")
    with engine.begin() as conn:  # as if attempt 1 had ended: the claim makes attempt 2
        conn.execute(update(steps).where(steps.c.run_id == run_id).values(attempt=1))
    worker = _worker(agent, names, tmp_path)
    with harness.running(harness.scheduler(engine, database_url, registry, names), worker):
        harness.wait_for(seen.started.is_set, what="the handler started")
        step = _step(engine, run_id)
        assert step.attempt == 2
        stale = Cancel(step_id=step.id, run_id=run_id, attempt=1, agent="worker", reason="old")
        harness.publish_to_exchange(names.control, "worker", stale.encode())
        queue = names.control_queue("worker", worker.id.rpartition(":")[2])
        harness.wait_for(
            lambda: (
                services.queue_figure(queue, "messages") == 0
                and services.queue_figure(queue, "messages_unacknowledged") == 0
            ),
            what="the stale cancel consumed",
        )
        assert not seen.calls[0].cancelled.is_set()
        assert worker.stats.cancelled == 0
        seen.release.set()
        harness.wait_for(lambda: _step(engine, run_id).state == "processed", what="processed")
    assert _step(engine, run_id).output == "released"


def test_a_cancel_made_while_no_relay_could_publish_it_reaches_the_agent_later(
    engine: Engine, database_url: str, names: Names, seen: Seen, tmp_path: Path
) -> None:
    registry, agent = _registry(seen)
    run_id = _submit(engine, registry, names, "prog")
    worker = _worker(agent, names, tmp_path)
    with harness.running(worker):
        with harness.running(harness.scheduler(engine, database_url, registry, names)):
            pid = _program_pid(tmp_path)
        _cancel(engine, names, run_id)  # no scheduler, so no relay, runs now
        with engine.connect() as conn:
            intent = conn.execute(
                select(events.c.attempt, events.c.detail, events.c.published).where(
                    events.c.run_id == run_id,
                    events.c.entity == "step",
                    events.c.to_state == "cancelled",
                )
            ).one()
        assert tuple(intent) == (1, {"agent": "worker"}, False)
        assert _alive(pid)
        assert _step(engine, run_id).state == "cancelled"
        with harness.running(harness.scheduler(engine, database_url, registry, names)):
            harness.wait_for(lambda: not _alive(pid), timeout=10, what="the program stopped")
            harness.wait_for(seen.returned.is_set, timeout=GRACE, what="the handler returned")
    assert worker.stats.cancelled == 1
    assert (_step(engine, run_id).state, _step(engine, run_id).failure_count) == ("cancelled", 0)


def _published(engine: Engine, run_id: int) -> bool:
    """Whether the relay published the step's `cancelled` event (and so its `Cancel`)."""
    with engine.connect() as conn:
        return bool(
            conn.execute(
                select(events.c.published).where(
                    events.c.run_id == run_id,
                    events.c.entity == "step",
                    events.c.to_state == "cancelled",
                )
            ).scalar_one_or_none()
        )


def test_a_cancel_published_while_the_agent_reconnects_reaches_it_once_it_is_back(
    engine: Engine, database_url: str, names: Names, seen: Seen, tmp_path: Path
) -> None:
    registry, agent = _registry(seen)
    run_id = _submit(engine, registry, names, "prog")
    broker_port = int(urlsplit(services.broker_url()).port or 5672)
    with Proxy(broker_port) as proxy:
        worker = AgentWorker(
            agent,
            RabbitMQTransport(
                url_through(services.broker_url(), proxy.port), process_name="test-agent-reconnects"
            ),
            names,
            options=AgentOptions(children=ChildProcesses(tmp_path)),
        )
        queue = names.agent("worker")
        with harness.running(harness.scheduler(engine, database_url, registry, names), worker):
            pid = _program_pid(tmp_path)
            proxy.backend = closed_port()  # the agent cannot come back yet
            proxy.cut()
            harness.wait_for(
                lambda: (services.queue_figure(queue, "consumers") or 0) == 0,
                what="the agent disconnected",
                interval=0.2,
            )
            _cancel(engine, names, run_id)
            harness.wait_for(lambda: _published(engine, run_id), what="the cancel published")
            assert _alive(pid)
            proxy.backend = broker_port
            back_at = time.monotonic()
            harness.wait_for(
                lambda: (services.queue_figure(queue, "consumers") or 0) == 1,
                what="the agent reconnected",
                interval=0.2,
            )
            harness.wait_for(
                lambda: not _alive(pid), timeout=GRACE + 10, what="the program stopped"
            )
            stopped_after = time.monotonic() - back_at
            harness.wait_for(seen.returned.is_set, timeout=GRACE, what="the handler returned")
    print(f"program stopped {stopped_after:.3f}s after the broker was reachable again")
    assert seen.raised == ["ChildKilledError"]
    assert worker.stats.cancelled == 1
    assert worker.stats.replied_ok + worker.stats.replied_error + worker.stats.replied_failed == 0
    step = _step(engine, run_id)
    assert (step.state, step.failure_count, step.output) == ("cancelled", 0, None)
    assert _run_state(engine, run_id) == "cancelled"
