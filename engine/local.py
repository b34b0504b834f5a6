"""Every role of an app in one process: submitter, schedulers, agents and supervisor as threads.

The roles are the same classes the separate `sasflow` processes run; here they share one store
engine and get their transports from one factory (one broker connection per role, each owned
by the role's thread). Used by `sasflow demo` and `sasflow run`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Protocol

from sasflow.agents.agent import Agent
from sasflow.agents.worker import DEFAULT_CONCURRENCY, AgentWorker
from sasflow.backpressure import SubmitterBackpressure
from sasflow.errors import SasflowError
from sasflow.messages import DEFAULT_LIMITS, Limits
from sasflow.registry import Registry
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.schema_watch import SchemaWatch
from sasflow.store import migrate
from sasflow.store.db import Engine
from sasflow.submitter import DEFAULT_PREFETCH, Submitter
from sasflow.supervisor.dispatch import AlertDispatcher
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.supervisor.sinks import LogSink, Sink
from sasflow.transport.base import Transport
from sasflow.transport.topology import Names

log = logging.getLogger(__name__)

TransportFactory = Callable[[str], Transport]
"""Makes a new (unconnected) transport for the named role."""


class RoleCrashedError(SasflowError):
    """A role thread of the all-in-one process stopped on its own."""


class Role(Protocol):
    """What the runner needs of a role: `run()` until its stop event is set."""

    @property
    def stop_event(self) -> threading.Event: ...

    def run(self) -> None: ...


@dataclass(frozen=True)
class LocalOptions:
    """How many of each role run, and their tuning."""

    schedulers: int = 1
    agent_instances: int = 1
    """AgentWorkers per agent of the registry."""
    agent_concurrency: int = DEFAULT_CONCURRENCY
    submitter_prefetch: int = DEFAULT_PREFETCH
    scheduler: SchedulerOptions = field(default_factory=SchedulerOptions)
    supervisor: SupervisorOptions = field(default_factory=SupervisorOptions)
    limits: Limits = DEFAULT_LIMITS
    """Message limits of every role here (they replace `scheduler.limits`): one process, one
    setting."""
    backpressure: SubmitterBackpressure = field(default_factory=SubmitterBackpressure)
    """The submitter's bound and policy past it (docs/backpressure.md)."""


@dataclass
class _RoleThread:
    name: str
    role: Role
    thread: threading.Thread | None = None
    error: BaseException | None = None
    finished: bool = False


class LocalRunner:
    """Runs roles as threads of this process, stops them together and reports crashes.

    A role that raises, or returns while nobody asked it to stop, has crashed: `check()` and
    `wait()` raise RoleCrashedError naming it.
    """

    def __init__(self) -> None:
        self._roles: list[_RoleThread] = []
        self._lock = threading.Lock()

    def add(self, name: str, role: Role) -> None:
        """Register `role`; it starts with `start()` (or at once if the runner started)."""
        entry = _RoleThread(name, role)
        self._roles.append(entry)
        if any(r.thread is not None for r in self._roles):
            self._start(entry)

    @property
    def names(self) -> list[str]:
        return [r.name for r in self._roles]

    def start(self) -> None:
        for entry in self._roles:
            if entry.thread is None:
                self._start(entry)

    def _start(self, entry: _RoleThread) -> None:
        def target() -> None:
            try:
                entry.role.run()
            except BaseException as exc:  # surfaced by check(); the thread must not die silently
                log.exception("role %s crashed", entry.name)
                with self._lock:
                    entry.error = exc
            finally:
                with self._lock:
                    entry.finished = True

        entry.thread = threading.Thread(target=target, name=entry.name, daemon=True)
        entry.thread.start()

    def crashed(self) -> list[str]:
        """The roles that raised, or returned without being asked to stop (with why)."""
        found = []
        with self._lock:
            for entry in self._roles:
                if entry.error is not None:
                    found.append(f"{entry.name}: {entry.error!r}")
                elif entry.finished and not entry.role.stop_event.is_set():
                    found.append(f"{entry.name}: stopped on its own")
                elif entry.finished and (status := getattr(entry.role, "exit_code", 0)):
                    # An agent wedged past its bound (sasflow.agents.wedge): restart it all.
                    found.append(f"{entry.name}: stopped with status {status}")
        return found

    def check(self) -> None:
        """Raise RoleCrashedError when a role crashed."""
        crashed = self.crashed()
        if crashed:
            raise RoleCrashedError("role crashed: " + "; ".join(crashed))

    def wait(self, stop: threading.Event, poll: float = 0.2) -> None:
        """Block until `stop` is set; raise RoleCrashedError as soon as a role crashed."""
        while not stop.wait(poll):
            self.check()

    def stop(self, timeout: float = 30.0) -> list[str]:
        """Ask every role to stop, join them; returns the names still running after `timeout`
        (each role gets what is left of the one shared timeout)."""
        for entry in self._roles:
            entry.role.stop_event.set()
        deadline = time.monotonic() + timeout
        for entry in self._roles:
            if entry.thread is not None:
                entry.thread.join(max(0.0, deadline - time.monotonic()))
        return [r.name for r in self._roles if r.thread is not None and r.thread.is_alive()]

    @contextmanager
    def running(self, stop_timeout: float = 30.0) -> Iterator[LocalRunner]:
        """Start the roles; on exit stop them and raise RoleCrashedError if one crashed or
        one would not stop."""
        self.start()
        try:
            yield self
        finally:
            alive = self.stop(stop_timeout)
        self.check()
        if alive:
            raise RoleCrashedError(f"roles did not stop within {stop_timeout:.0f}s: {alive}")


def prepare_store(engine: Engine) -> None:
    """Create or migrate the schema (the all-in-one process owns its store)."""
    migrate.upgrade(engine)


def add_roles(
    runner: LocalRunner,
    engine: Engine,
    transports: TransportFactory,
    registry: Registry,
    names: Names,
    *,
    database_url: str,
    options: LocalOptions | None = None,
    sinks: Sequence[Sink] | None = None,
    agents: Sequence[Agent] | None = None,
) -> None:
    """Add the submitter, the schedulers, the agent workers and the supervisor of `registry`.

    `agents` defaults to the registry's Python agents (external agents run elsewhere);
    `sinks` to logging the alerts.
    """
    options = options or LocalOptions()
    runner.add(
        "submitter",
        Submitter(
            engine,
            transports("submitter"),
            registry,
            names,
            prefetch=options.submitter_prefetch,
            limits=options.limits,
            backpressure=options.backpressure,
        ),
    )
    for number in range(1, options.schedulers + 1):
        runner.add(
            f"scheduler-{number}",
            Scheduler(
                engine,
                transports(f"scheduler-{number}"),
                registry,
                names,
                database_url=database_url,
                options=replace(options.scheduler, limits=options.limits),
            ),
        )
    served = agents if agents is not None else [a for a in registry.agents if isinstance(a, Agent)]
    for agent in served:
        for number in range(1, options.agent_instances + 1):
            name = f"agent-{agent.name}-{number}"
            runner.add(
                name,
                AgentWorker(
                    agent,
                    transports(name),
                    names,
                    concurrency=options.agent_concurrency,
                    limits=options.limits,
                ),
            )
    schema = SchemaWatch(engine, "supervisor")
    dispatcher = AlertDispatcher(
        engine,
        list(sinks) if sinks is not None else [LogSink()],
        namespace=names.namespace,
        schema=schema,
    )
    runner.add(
        "supervisor",
        Supervisor(
            engine,
            names,
            transport=transports("supervisor"),
            dispatcher=dispatcher,
            options=options.supervisor,
            schema=schema,
        ),
    )
