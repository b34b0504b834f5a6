"""The one seam through which metrics, traces and structured logs attach to the role loops.

A role (scheduler, submitter, agent, supervisor) takes a `Hooks` object and calls it at fixed
points of its loop; every method of the base class does nothing, so a role without hooks pays
one method call per event. An extension subclasses `Hooks`, overrides the events it cares
about, and `HookChain` fans each event out to several of them. docs/observability.md lists the
events, which thread calls each, and what the built-in hooks do with them.

Rules for implementers:
- A hook never raises into the role: `HookChain` logs a hook's exception and carries on (roles
  wrap what they are given with `guarded`).
- A hook must be quick and must not block: it runs on the role's loop thread (or, for the
  `handler_*` events, on the agent's worker thread that runs the handler).
- The events that take a `conn` are called inside the role's transaction: a hook may read with
  it (the store's functions) but must not commit, roll back or write business state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: agents import this module and must not load the store
    from sasflow.commands import FinishedRun
    from sasflow.messages import Reply, Request
    from sasflow.store.db import Connection
    from sasflow.store.runs.apply import ApplyReport
    from sasflow.store.runs.claim import ClaimedStep
    from sasflow.store.runs.sweeps import SweepReport
    from sasflow.transport.base import Delivery

log = logging.getLogger(__name__)

Headers = Mapping[str, Any]
"""AMQP message headers a hook adds to an outgoing message (e.g. W3C `traceparent`)."""


class Hooks:
    """Events of the role loops; every method is a no-op here."""

    # -- submitter ------------------------------------------------------------------------

    def submission_received(self, delivery: Delivery) -> str | None:
        """A submission is about to be recorded as a run; a W3C `traceparent` to store with
        the run (the trace every later span of the run joins), or None."""
        return None

    def runs_submitted(self, created: int, duplicates: int) -> None:
        """A batch of submissions committed."""

    def submissions_refused(self, workflow: str, door: str, count: int) -> None:
        """`count` submissions of `workflow` found its backlog at its bound at `door` (`api`:
        answered 429; `submitter`: dead-lettered by its reject policy, or held in its queue
        by the hold policy, counted once per delivery held)."""

    # -- scheduler ------------------------------------------------------------------------

    def steps_claimed(self, conn: Connection, steps: Sequence[ClaimedStep], seconds: float) -> None:
        """A claim statement took `steps` (possibly none) in `seconds`, in its transaction."""

    def steps_budgeted(
        self, admitted: Mapping[str, int], held: Mapping[str, int], tokens: Mapping[str, float]
    ) -> None:
        """The budgeted claim (flow limits, docs/flow-control.md) committed: steps admitted and
        candidates held back per limit (implicit bounds named `fleet:AGENT`,
        `breaker:AGENT/DEPENDENCY`), and the calls each rate limit without a key would admit
        now."""

    def request_headers(self, step: ClaimedStep) -> Headers | None:
        """Headers for the request that dispatches `step`."""
        return None

    def steps_dispatched(self, count: int, seconds: float) -> None:
        """`count` requests of one claim batch were confirmed by the broker in `seconds`."""

    def replies_applied(
        self, replies: Sequence[tuple[Delivery, Reply]], report: ApplyReport, seconds: float
    ) -> None:
        """A batch of replies was applied (committed) in `seconds`."""

    def events_relayed(self, count: int, seconds: float) -> None:
        """`count` status events (the outbox) were published and marked in `seconds`
        (scheduler, submitter)."""

    def runs_finished(self, conn: Connection, finished: Mapping[int, FinishedRun]) -> None:
        """Runs reached a terminal state (run id -> its state and workflow), inside the
        transaction that did it (scheduler: applying replies; supervisor: escalating an
        expired step, a run's deadline)."""

    # -- agent (worker threads, except where said) -----------------------------------------

    def handler_started(self, request: Request, headers: Headers) -> None:
        """The worker thread is about to run the handler for `request` (its delivery's
        `headers`)."""

    def handler_retrying(self, request: Request, error: BaseException, attempt: int) -> None:
        """The handler raised a transient `error` on `attempt` and will be retried."""

    def handler_finished(
        self, request: Request, reply: Reply | None, seconds: float, breaker: str | None
    ) -> Headers | None:
        """The handler (with its retries) ended in `reply` (None: stay silent) after
        `seconds`; `breaker` is its dependency's breaker state. Headers for the reply."""
        return None

    def breaker_changed(self, agent: str, dependency: str, state: str) -> None:
        """A dependency's breaker changed state (`closed`, `open`, `half-open`); any thread."""

    def threads_held(self, agent: str, held: int, concurrency: int) -> None:
        """The worker threads held by handlers past their deadline changed (`held` =
        `concurrency`: the process is wedged); the agent's owner thread."""

    # -- every role that consumes ---------------------------------------------------------

    def dead_lettered(self, queue: str, reason: str) -> None:
        """A message taken from `queue` was dead-lettered with `reason`."""

    def consumer_cancelled(self, queue: str) -> None:
        """The broker cancelled the role's consumer of `queue` (the queue deleted, or its node
        lost); the role reconnects, declares its queues and consumes again (loop thread)."""

    # -- supervisor -----------------------------------------------------------------------

    def steps_expired(self, conn: Connection, rows: Sequence[Any], reason: str) -> None:
        """The supervisor counted a failure for steps (rows with `id`, `run_id`, `attempt`,
        `state`) whose deadline passed (`reason` "expired") or whose request was
        dead-lettered, in its transaction."""

    def wait_expired(self, conn: Connection, rows: Sequence[Any]) -> None:
        """The supervisor found that no agent took these steps' requests within their wait
        timeout (rows with `id`, `run_id`, `agent`, `attempt`, `wait_expiries`): pending
        again, no failure counted (docs/timeouts.md), in its transaction."""

    def sweep_finished(self, report: SweepReport | None) -> None:
        """One sweep ended (None: another supervisor holds the lease)."""

    def alert_raised(self, kind: str) -> None:
        """The supervisor's dispatcher took a newly raised alert of `kind` to deliver."""

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """The process is stopping: flush and release what the hooks hold."""


def _merge(results: Sequence[Headers | None]) -> Headers | None:
    merged: dict[str, Any] = {}
    for result in results:
        if result:
            merged.update(result)
    return merged or None


EVENTS = tuple(name for name, value in vars(Hooks).items() if callable(value) and name[0] != "_")
"""Every event of `Hooks` (its public methods)."""

Listeners = tuple[tuple[Hooks, Callable[..., Any]], ...]


def listeners(hooks: Sequence[Hooks], event: str) -> Listeners:
    """The hooks that do something on `event`, each with its bound method: a hook that leaves
    `event` to the no-op of `Hooks` is not called at all (no call, no argument tuple)."""
    noop = getattr(Hooks, event)
    found = []
    for hook in hooks:
        method = getattr(hook, event)
        if getattr(method, "__func__", None) is not noop:
            found.append((hook, method))
    return tuple(found)


class HookChain(Hooks):
    """Fans every event out to `hooks`, in order; a hook that raises is logged and skipped.

    Which hooks hear which event is worked out once, here: an event no hook overrides costs
    the role a method call and an empty loop."""

    def __init__(self, hooks: Sequence[Hooks]) -> None:
        self.hooks = tuple(hooks)
        self._closed = False
        self._on: dict[str, Listeners] = {event: listeners(self.hooks, event) for event in EVENTS}

    def _tell(self, event: str, *args: Any) -> None:
        for hook, call in self._on[event]:
            try:
                call(*args)
            except Exception:  # an observer must never take the role down
                log.exception("hook %s failed on %s", type(hook).__name__, event)

    def _ask(self, event: str, on: Listeners, *args: Any) -> list[Any]:
        results = []
        for hook, call in on:
            try:
                results.append(call(*args))
            except Exception:  # an observer must never take the role down
                log.exception("hook %s failed on %s", type(hook).__name__, event)
        return results

    def submission_received(self, delivery: Delivery) -> str | None:
        on = self._on["submission_received"]
        if not on:
            return None
        found = self._ask("submission_received", on, delivery)
        return next((r for r in found if r), None)

    def runs_submitted(self, created: int, duplicates: int) -> None:
        self._tell("runs_submitted", created, duplicates)

    def submissions_refused(self, workflow: str, door: str, count: int) -> None:
        self._tell("submissions_refused", workflow, door, count)

    def steps_claimed(self, conn: Connection, steps: Sequence[ClaimedStep], seconds: float) -> None:
        self._tell("steps_claimed", conn, steps, seconds)

    def steps_budgeted(
        self, admitted: Mapping[str, int], held: Mapping[str, int], tokens: Mapping[str, float]
    ) -> None:
        self._tell("steps_budgeted", admitted, held, tokens)

    def request_headers(self, step: ClaimedStep) -> Headers | None:
        on = self._on["request_headers"]
        if not on:
            return None
        return _merge(self._ask("request_headers", on, step))

    def steps_dispatched(self, count: int, seconds: float) -> None:
        self._tell("steps_dispatched", count, seconds)

    def replies_applied(
        self, replies: Sequence[tuple[Delivery, Reply]], report: ApplyReport, seconds: float
    ) -> None:
        self._tell("replies_applied", replies, report, seconds)

    def events_relayed(self, count: int, seconds: float) -> None:
        self._tell("events_relayed", count, seconds)

    def runs_finished(self, conn: Connection, finished: Mapping[int, FinishedRun]) -> None:
        self._tell("runs_finished", conn, finished)

    def handler_started(self, request: Request, headers: Headers) -> None:
        self._tell("handler_started", request, headers)

    def handler_retrying(self, request: Request, error: BaseException, attempt: int) -> None:
        self._tell("handler_retrying", request, error, attempt)

    def handler_finished(
        self, request: Request, reply: Reply | None, seconds: float, breaker: str | None
    ) -> Headers | None:
        on = self._on["handler_finished"]
        if not on:
            return None
        # Last started, first finished: context a hook attached in handler_started is
        # detached in the reverse order.
        return _merge(self._ask("handler_finished", on[::-1], request, reply, seconds, breaker))

    def breaker_changed(self, agent: str, dependency: str, state: str) -> None:
        self._tell("breaker_changed", agent, dependency, state)

    def threads_held(self, agent: str, held: int, concurrency: int) -> None:
        self._tell("threads_held", agent, held, concurrency)

    def dead_lettered(self, queue: str, reason: str) -> None:
        self._tell("dead_lettered", queue, reason)

    def consumer_cancelled(self, queue: str) -> None:
        self._tell("consumer_cancelled", queue)

    def steps_expired(self, conn: Connection, rows: Sequence[Any], reason: str) -> None:
        self._tell("steps_expired", conn, rows, reason)

    def wait_expired(self, conn: Connection, rows: Sequence[Any]) -> None:
        self._tell("wait_expired", conn, rows)

    def sweep_finished(self, report: SweepReport | None) -> None:
        self._tell("sweep_finished", report)

    def alert_raised(self, kind: str) -> None:
        self._tell("alert_raised", kind)

    def close(self) -> None:
        """Close every hook once (later calls do nothing)."""
        if not self._closed:
            self._closed = True
            self._tell("close")


NO_HOOKS = Hooks()
"""The hooks of a role given none (stateless, so one instance serves every role)."""


def guarded(hooks: Hooks | None) -> Hooks:
    """What a role keeps: no hooks, or `hooks` behind a HookChain so that none can raise."""
    if hooks is None:
        return NO_HOOKS
    return hooks if isinstance(hooks, HookChain) else HookChain([hooks])
