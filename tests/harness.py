"""Run sasflow roles in threads of the test process, against the real services."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pika
import pika.exceptions
from click.testing import CliRunner, Result
from pika.exchange_type import ExchangeType
from sqlalchemy import Engine, select

from sasflow.agents.agent import Agent
from sasflow.agents.worker import AgentWorker
from sasflow.commands import NewRun
from sasflow.hooks import Hooks
from sasflow.registry import Registry
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.store.db import transaction
from sasflow.store.runs.submit import submit as store_submit
from sasflow.store.schema import runs, steps
from sasflow.submitter import Submitter
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import REASON_HEADER, Names
from tests import services


class Role(Protocol):
    @property
    def stop_event(self) -> threading.Event: ...

    def run(self) -> None: ...


@contextlib.contextmanager
def running(*roles: Role, join_timeout: float = 30.0) -> Iterator[None]:
    """Run each role's `run()` in a thread; stop them all (as SIGTERM would) on exit."""
    errors: list[BaseException] = []

    def target(role: Role) -> None:
        try:
            role.run()
        except BaseException as exc:
            errors.append(exc)
            raise

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in roles]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        for role in roles:
            # A scheduler's stop() also wakes it from its wait (up to its rescan interval).
            stop = role.stop if isinstance(role, Scheduler) else role.stop_event.set
            stop()
        for thread in threads:
            thread.join(join_timeout)
        alive = [t.name for t in threads if t.is_alive()]
        assert not alive, f"roles did not stop within {join_timeout}s: {alive}"
    assert not errors, f"a role crashed: {errors!r}"


def cli(
    database_url: str, names: Names, app: str, *, expect: int | None = None
) -> Callable[..., Result]:
    """`sasflow ARGS...` in this process (CliRunner) on the test's database and namespace, with
    `app`; with `expect`, each call asserts that exit status."""

    env = {
        "SASFLOW_DATABASE_URL": database_url,
        "SASFLOW_NAMESPACE": names.namespace,
        "SASFLOW_APP": app,
    }

    def invoke(*args: str) -> Result:
        from sasflow.cli.main import cli as sasflow_cli  # noqa: PLC0415 - only tests of it load the CLI

        result = CliRunner().invoke(sasflow_cli, list(args), env=env)
        if expect is not None:
            assert result.exit_code == expect, result.output
        return result

    return invoke


def transport(role: str) -> RabbitMQTransport:
    return RabbitMQTransport(services.broker_url(), process_name=f"test-{role}")


def scheduler(
    engine: Engine,
    database_url: str,
    registry: Registry,
    names: Names,
    hooks: Hooks | None = None,
    **options: Any,
) -> Scheduler:
    return Scheduler(
        engine,
        transport("scheduler"),
        registry,
        names,
        database_url=database_url,
        options=SchedulerOptions(**options),
        hooks=hooks,
    )


def agent(
    agent: Agent, names: Names, concurrency: int = 4, hooks: Hooks | None = None
) -> AgentWorker:
    return AgentWorker(
        agent, transport(f"agent-{agent.name}"), names, concurrency=concurrency, hooks=hooks
    )


def submitter(engine: Engine, registry: Registry, names: Names) -> Submitter:
    return Submitter(engine, transport("submitter"), registry, names)


def submit(
    engine: Engine, registry: Registry, names: Names, workflow: str, *, key: str, run_input: Any
) -> int:
    """Record one run in its own transaction (as `submit_run` does); returns its id."""
    with transaction(engine) as conn:
        return store_submit(
            conn,
            registry,
            NewRun(workflow=workflow, key=key, input=run_input),
            namespace=names.namespace,
            actor="test",
        ).run_id


def wait_for(
    predicate: Callable[[], bool],
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.05,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def run_states(engine: Engine) -> dict[int, str]:
    with engine.connect() as conn:
        return {r.id: r.state for r in conn.execute(select(runs.c.id, runs.c.state))}


def all_runs_in(engine: Engine, states: set[str], count: int) -> Callable[[], bool]:
    def check() -> bool:
        found = run_states(engine)
        return len(found) == count and set(found.values()) <= states

    return check


def step_rows(engine: Engine, run_id: int | None = None) -> list[Any]:
    query = select(steps).order_by(steps.c.id)
    if run_id is not None:
        query = query.where(steps.c.run_id == run_id)
    with engine.connect() as conn:
        return list(conn.execute(query))


def publish_raw(queue: str, body: bytes, **properties: Any) -> None:
    with services.broker_channel() as channel:
        channel.confirm_delivery()
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, **properties))


def publish_to_exchange(exchange: str, routing_key: str, body: bytes) -> None:
    with services.broker_channel() as channel:
        channel.confirm_delivery()
        channel.basic_publish(
            exchange, routing_key, body, pika.BasicProperties(delivery_mode=2), mandatory=True
        )


def dead_letters(names: Names, expected: int, timeout: float = 15.0) -> list[dict[str, Any]]:
    """Wait for and take `expected` messages from the namespace's dead-letter queue."""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    with services.broker_channel() as channel:
        while len(found) < expected and time.monotonic() < deadline:
            method, props, body = channel.basic_get(names.dead_letter_queue, auto_ack=True)
            if method is None:
                time.sleep(0.05)
                continue
            headers = dict((props.headers if props else None) or {})
            found.append({"body": body, "headers": headers, "reason": headers.get(REASON_HEADER)})
    assert len(found) == expected, f"expected {expected} dead letters, got {found!r}"
    return found


def bind_status_queue(names: Names, binding: str = "#") -> str:
    """A queue of the test's namespace bound to the status exchange; returns its name."""
    queue = f"{names.namespace}.test-status"
    with services.broker_channel() as channel:
        channel.exchange_declare(names.status, exchange_type=ExchangeType("topic"), durable=True)
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, names.status, routing_key=binding)
    return queue


def drain_json(
    queue: str, *, until: Callable[[list[dict[str, Any]]], bool], timeout: float = 20.0
) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    with services.broker_channel() as channel:
        while time.monotonic() < deadline and not until(messages):
            method, props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                time.sleep(0.05)
                continue
            message = json.loads(body or b"null")
            message["_routing_key"] = method.routing_key
            message["_headers"] = dict((props.headers if props else None) or {})
            messages.append(message)
    return messages


def consumers(queue: str) -> int:
    """The broker's count of consumers of `queue` now (0 while it does not exist)."""
    try:
        with services.broker_channel() as channel:
            declared = channel.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker:
        return 0
    return int(declared.method.consumer_count or 0)
