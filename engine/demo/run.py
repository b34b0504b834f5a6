"""One demo run: start every role in this process, place the orders, watch them to the end.

The roles are the real ones (sasflow.local); only the remote services are simulated. The
outcome is judged from the state store: `DemoResult.problems` lists what the demo is designed
to show but did not happen.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sasflow.agents.worker import AgentWorker
from sasflow.demo.app import build_registry, inventory_agent, payments_agent, shipping_agent
from sasflow.demo.feed import News, StoreFeed
from sasflow.demo.provider import EVENT, PaymentProvider, confirmation
from sasflow.demo.scenario import DEFAULT_ORDERS, DEFAULT_SEED, Scenario
from sasflow.demo.services import Happenings, RemoteServices
from sasflow.demo.summary import Summary, missing_phenomena, summarize
from sasflow.errors import PublishError
from sasflow.local import LocalOptions, LocalRunner, TransportFactory, add_roles, prepare_store
from sasflow.messages import Submission
from sasflow.scheduler import SchedulerOptions
from sasflow.states import TERMINAL_RUN_STATES
from sasflow.store.db import Engine
from sasflow.store.inbound.ingest import is_stored
from sasflow.store.operator.inspect import runs_by_state
from sasflow.store.operator.waiting import Waiting, open_waits
from sasflow.supervisor.service import SupervisorOptions
from sasflow.supervisor.sinks import LogSink
from sasflow.transport.base import Outgoing
from sasflow.transport.topology import Names, declare_common

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25

EARLY_EVENT_SECONDS = 10.0
"""How long the demo waits for the early payment confirmation to be stored."""

Tick = Callable[[dict[str, int], list[News], list[Waiting]], None]
"""Receives the demo's run counts by state, the news since the last tick, and the steps
sleeping or waiting for an event now."""


@dataclass(frozen=True)
class DemoOptions:
    orders: int = DEFAULT_ORDERS
    seed: int = DEFAULT_SEED
    timeout: float = 120.0
    """Seconds to wait for every order to finish before calling the demo failed."""
    schedulers: int = 2
    shipping_instances: int = 2
    """One of them crashes; the others finish its work."""


@dataclass(frozen=True)
class DemoResult:
    summary: Summary
    problems: list[str]
    seconds: float
    key_prefix: str
    agent_counts: dict[str, int] = field(default_factory=dict)
    """What the simulated services saw (transient errors retried inside the agents, ...)."""


def order_id(key_prefix: str, number: int) -> str:
    """The id (and business key) of order `number` placed with `key_prefix`."""
    return f"{key_prefix}{number:05d}"


OrderInput = Callable[[Scenario, int, str], dict[str, Any]]
"""The input of an order: (scenario, order number from 1, key prefix) -> the run's input."""


def demo_order_input(scenario: Scenario, number: int, key_prefix: str) -> dict[str, Any]:
    """The demo's order input: the scenario's order and its id."""
    return {**scenario.order(number), "order_id": order_id(key_prefix, number)}


def place_orders(
    transports: TransportFactory,
    names: Names,
    scenario: Scenario,
    key_prefix: str,
    order_input: OrderInput = demo_order_input,
) -> None:
    """Publish every order of `scenario` to `<ns>.submit`, as a shop front would, each with
    `order_input`'s input. An order's id (`order_id`, what its payment confirmation is matched
    on) is its business key."""
    transport = transports("demo-shop")
    transport.connect()
    try:
        declare_common(transport, names)
        messages = [
            Outgoing(
                "",
                names.submit,
                Submission(
                    workflow=scenario.workflow(n),
                    input=order_input(scenario, n, key_prefix),
                    key=order_id(key_prefix, n),
                ).encode(),
                mandatory=True,
            )
            for n in range(1, scenario.orders + 1)
        ]
        refused = [e for e in transport.publish_many(messages) if e is not None]
        if refused:
            raise PublishError(f"{len(refused)} orders refused by the broker: {refused[0]}")
    finally:
        transport.close()


class Demo:
    """The demo's roles, services and orders, on the given store and transports."""

    def __init__(
        self,
        engine: Engine,
        transports: TransportFactory,
        names: Names,
        *,
        database_url: str,
        options: DemoOptions | None = None,
    ) -> None:
        self._engine = engine
        self._transports = transports
        self._names = names
        self._database_url = database_url
        self.options = options or DemoOptions()
        self.scenario = Scenario.build(self.options.orders, self.options.seed)
        self.key_prefix = f"demo-{uuid.uuid4().hex[:8]}-"
        self.happenings = Happenings()

    def _runner(self, provider: PaymentProvider) -> LocalRunner:
        services = RemoteServices(self.scenario, self.happenings)
        registry = build_registry(services)
        runner = LocalRunner()
        runner.add("payment-provider", provider)
        options = LocalOptions(
            schedulers=self.options.schedulers,
            agent_concurrency=4,
            scheduler=SchedulerOptions(rescan_interval=0.2, relay_interval=0.5),
            supervisor=SupervisorOptions(interval=0.5, lease_ttl=3.0),
        )
        add_roles(
            runner,
            self._engine,
            self._transports,
            registry,
            self._names,
            database_url=self._database_url,
            options=options,
            sinks=[LogSink()],
            agents=[inventory_agent(services), payments_agent(services, provider.confirm)],
        )
        for number in range(1, self.options.shipping_instances + 1):
            # Each instance has its own Agent object so the one that crashes stops itself.
            stop = threading.Event()
            name = f"agent-shipping-{number}"
            runner.add(
                name,
                AgentWorker(
                    shipping_agent(services, on_crash=stop.set),
                    self._transports(name),
                    self._names,
                    concurrency=2,
                    stop=stop,
                ),
            )
        return runner

    def _confirm_early(self, provider: PaymentProvider, runner: LocalRunner) -> bool:
        """Have the provider confirm the scenario's early order before it is placed, and wait
        until the submitter stored that event (unmatched: no wait is open yet)."""
        number = self.scenario.early
        order = self.scenario.order(number)
        early = confirmation(order_id(self.key_prefix, number), order["qty"] * order["unit_price"])
        provider.confirm(early["correlation"], early["payload"]["amount"], delay=0.0)
        deadline = time.monotonic() + EARLY_EVENT_SECONDS
        while time.monotonic() < deadline:
            runner.check()
            with self._engine.connect() as conn:
                if is_stored(conn, EVENT, early["id"]):
                    return True
            time.sleep(0.05)
        return False

    def run(self, tick: Tick, stop: threading.Event | None = None) -> DemoResult:
        """Run the demo to its end (or `timeout`, or `stop`); raises RoleCrashedError when a
        role crashed."""
        stop = stop or threading.Event()
        prepare_store(self._engine)
        feed = StoreFeed(self._engine, self.key_prefix, self.happenings)
        started = time.monotonic()
        problems: list[str] = []
        unconfirmed = self.scenario.unconfirmed
        provider = PaymentProvider(
            self._transports("demo-payment-provider"),
            self._names,
            self.options.seed,
            withhold=[order_id(self.key_prefix, unconfirmed)],
        )
        runner = self._runner(provider)
        with runner.running():
            if not self._confirm_early(provider, runner):
                problems.append(
                    f"the early payment confirmation was not stored within {EARLY_EVENT_SECONDS:g}s"
                )
            place_orders(self._transports, self._names, self.scenario, self.key_prefix)
            news = [
                News(
                    "event",
                    f"the payment provider confirmed order {self.scenario.early} before it was "
                    f"placed: the event is stored, unmatched, until the order's wait opens",
                )
            ]
            deadline = started + self.options.timeout
            while True:
                runner.check()
                with self._engine.connect() as conn:
                    states = runs_by_state(conn, self.key_prefix)
                    waits = open_waits(conn, self.key_prefix)
                tick(states, [*news, *feed.poll()], waits)
                news = []
                finished = sum(n for s, n in states.items() if s in TERMINAL_RUN_STATES)
                if finished >= self.scenario.orders:
                    break
                if time.monotonic() >= deadline:
                    problems.append(
                        f"timed out after {self.options.timeout:g}s with "
                        f"{self.scenario.orders - finished} orders unfinished"
                    )
                    break
                if stop.wait(POLL_SECONDS):
                    problems.append("interrupted")
                    break
        seconds = time.monotonic() - started
        summary = summarize(self._engine, self.key_prefix)
        with self._engine.connect() as conn:
            states = runs_by_state(conn, self.key_prefix)
            waits = open_waits(conn, self.key_prefix)
        tick(states, feed.poll(), waits)  # one connection at a time: SQLite locks on BEGIN
        if not problems:
            problems = missing_phenomena(summary, self.scenario.orders, timeouts=1)
        return DemoResult(
            summary=summary,
            problems=problems,
            seconds=seconds,
            key_prefix=self.key_prefix,
            agent_counts=self.happenings.snapshot(),
        )
