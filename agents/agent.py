"""Agent definitions: a named group of handlers for one remote service."""

from __future__ import annotations

import inspect
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sasflow.agents.children import DEFAULT_GRACE, DEFAULT_TAIL_BYTES, ChildProcesses, Completed
from sasflow.agents.errors import BreakerOpenError, Defer, PermanentError, TransientError
from sasflow.agents.transient import TransientHttp
from sasflow.errors import DefinitionError
from sasflow.policy import BreakerPolicy, RetryPolicy
from sasflow.workflow import check_name


@dataclass(frozen=True)
class Call:
    """What a handler receives for one attempt of one step."""

    input: Any
    idempotency_key: str
    """Stable across attempts of the step: pass it to the remote service to deduplicate."""
    attempt: int
    deadline: float
    """`time.monotonic()` value after which the result is no longer wanted."""
    step_id: int
    run_id: int
    workflow: str
    step: str
    action: str
    kind: str
    map_index: int | None = None
    """An item of a map step (`Step.map`): its index in the map's list (from 0); None outside
    a map."""
    map_size: int | None = None
    """An item of a map step: how many items the map has; None outside a map."""
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False)
    """Set when the agent shuts down or the deadline passed; long handlers may poll it."""
    aborted: threading.Event = field(default_factory=threading.Event, compare=False)
    """Set when the agent gives up on the call: its deadline passed, or the agent stops and
    its drain timeout ran out. Programs started with `run` are killed then."""
    children: ChildProcesses = field(default_factory=ChildProcesses, compare=False, repr=False)
    beat: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    """Sends this attempt's heartbeat (set by the agent when the step asks for heartbeats)."""

    def remaining(self) -> float:
        """Seconds left before the deadline (use it as the remote call's timeout)."""
        return max(0.0, self.deadline - time.monotonic())

    def heartbeat(self) -> None:
        """Tell the scheduler this attempt is alive (docs/timeouts.md, the heartbeat clock).

        Call it as often as you like, from any thread: it returns at once and sends at most one
        message per third of the step's heartbeat timeout. A step without a heartbeat timeout
        needs none, and the call does nothing. It never extends the deadline: the step's
        timeout caps the attempt however often it heartbeats."""
        if self.beat is not None:
            self.beat()

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        grace: float = DEFAULT_GRACE,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
    ) -> Completed:
        """Run the program `argv` (a list of strings, never through a shell) in its own process
        group and return its exit code and output tails; its group is killed (SIGTERM, SIGKILL
        after `grace`) if the deadline passes or the agent gives up first, which raises
        ChildKilledError. `env` adds to the agent's environment. See sasflow.agents.children."""
        return self.children.run(
            argv,
            deadline=self.deadline,
            abort=self.aborted,
            env=env,
            cwd=cwd,
            grace=grace,
            tail_bytes=tail_bytes,
        )


Handler = Callable[[Call], Any]


@dataclass(frozen=True)
class HandlerSpec:
    action: str
    function: Handler
    dependency: str | None
    retry: RetryPolicy


DEFAULT_TRANSIENT: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)


class Agent:
    """Handlers for one remote service, with their retry policies and circuit breakers.

    `transient` lists exception types retried within the deadline (besides TransientError);
    `http` says which failures of the HTTP clients (httpx, requests, urllib3, urllib) are
    retried too (None: none of them); any other exception is a permanent failure, replied as
    `error`. A handler is a function or an `async def` function (run on the agent's event
    loop, sasflow.agents.aio).
    """

    def __init__(
        self,
        name: str,
        *,
        breakers: Mapping[str, BreakerPolicy] | None = None,
        retry: RetryPolicy | None = None,
        transient: tuple[type[BaseException], ...] = DEFAULT_TRANSIENT,
        http: TransientHttp | None = TransientHttp(),  # noqa: B008 - frozen, shared safely
    ) -> None:
        check_name("agent", name)
        self._name = name
        self.breakers: dict[str, BreakerPolicy] = dict(breakers or {})
        for dependency in self.breakers:
            check_name(f"agent {name!r}: dependency", dependency)
        self.retry = retry or RetryPolicy()
        self.transient = transient
        self.http = http
        self._handlers: dict[str, HandlerSpec] = {}

    @property
    def name(self) -> str:
        return self._name

    @property
    def actions(self) -> frozenset[str]:
        return frozenset(self._handlers)

    def handler(
        self,
        action: str,
        *,
        dependency: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of `action`."""

        def register(function: Handler) -> Handler:
            self.add_handler(action, function, dependency=dependency, retry=retry)
            return function

        return register

    def add_handler(
        self,
        action: str,
        function: Handler,
        *,
        dependency: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        check_name(f"agent {self._name!r}: action", action)
        if inspect.isasyncgenfunction(function) or inspect.isgeneratorfunction(function):
            raise DefinitionError(
                f"agent {self._name!r}: the handler of {action!r} is a generator function; a "
                "handler returns its output (a plain or an `async def` function)"
            )
        if action in self._handlers:
            raise DefinitionError(f"agent {self._name!r}: duplicate handler for {action!r}")
        if dependency is not None and dependency not in self.breakers:
            raise DefinitionError(
                f"agent {self._name!r}: action {action!r} names dependency {dependency!r}, "
                f"which has no breaker (declared: {', '.join(sorted(self.breakers)) or 'none'})"
            )
        self._handlers[action] = HandlerSpec(action, function, dependency, retry or self.retry)

    def is_transient(self, exc: BaseException) -> bool:
        """Whether `exc` is worth retrying within the deadline (docs/agents.md)."""
        if isinstance(exc, PermanentError | BreakerOpenError | Defer):
            return False
        if isinstance(exc, (TransientError, *self.transient)):
            return True
        return self.http is not None and self.http.is_transient(exc)

    def retry_after(self, exc: BaseException) -> float | None:
        """Seconds the remote service asked to wait before the next try (`Retry-After`)."""
        return self.http.retry_after_of(exc) if self.http is not None else None

    def spec(self, action: str) -> HandlerSpec | None:
        return self._handlers.get(action)

    def uses(self) -> dict[str, str | None]:
        """Each action -> the dependency (breaker) its handler calls through, or None: what
        the agent's heartbeats tell the cluster (flow limits on a dependency, docs/protocol.md)."""
        return {action: spec.dependency for action, spec in sorted(self._handlers.items())}

    def __repr__(self) -> str:
        return f"Agent({self._name!r}, actions={sorted(self._handlers)})"
