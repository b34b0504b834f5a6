"""The agent role: consume one agent's requests, run handlers in worker threads, reply.

The thread that owns the broker connection never runs a handler, so heartbeats keep flowing
however long a handler takes; worker threads hand their outcome back through a queue and
`call_threadsafe`, and never touch pika.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sasflow.agents.acks import DEFAULT_CONSUMER_TIMEOUT, EarlyAcks, ack_taken, waited_too_long
from sasflow.agents.agent import Agent, Call, HandlerSpec
from sasflow.agents.children import DEFAULT_GRACE, ChildProcesses
from sasflow.agents.errors import BreakerOpenError, PermanentError, TransientError
from sasflow.agents.fleet import FleetLink
from sasflow.agents.jobs import AgentStats, Job, Outcome, retry_budget
from sasflow.agents.progress import ProgressLink
from sasflow.agents.resilience import SharedBreaker, retrying
from sasflow.errors import BrokerUnavailableError, InvalidMessageError, UnroutableError
from sasflow.hooks import Hooks, guarded
from sasflow.messages import (
    DEFAULT_LIMITS,
    ErrorInfo,
    Limits,
    Reply,
    Request,
    dumps,
    parse,
    safe_text,
)
from sasflow.runtime import Reconnect, process_id, serve_forever
from sasflow.states import ReplyStatus
from sasflow.transport.base import Delivery, Outgoing, Transport
from sasflow.transport.topology import Names, declare_agent_queue, declare_common

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 4
"""Worker threads of an agent process, and requests it takes from its queue at once."""


MAX_DEFER_SECONDS = 86400.0
"""Longest deferral an agent asks for; the step's give-up age bounds the total anyway."""


@dataclass(frozen=True)
class AgentOptions:
    """Fleet and shutdown tuning of one agent process (the CLI fills it from its options)."""

    heartbeat_interval: float = 5.0
    """Seconds between two fleet heartbeats; 3 missed ones make the instance `lost`."""
    drain_timeout: float | None = None
    """Seconds a stopping agent waits for running steps; then it kills their programs and
    leaves the requests still unanswered to the broker, which redelivers them. None: wait for
    each step until its deadline."""
    children: ChildProcesses = field(default_factory=ChildProcesses)
    """Where the programs of `Call.run` keep their pid files (none by default)."""
    consumer_timeout: float | None = DEFAULT_CONSUMER_TIMEOUT
    """The broker's consumer timeout in seconds (None: it has none): requests of steps whose
    budget is at least half of it are acknowledged when they start (sasflow.agents.acks)."""


ABORT_SETTLE = 2.0
"""Seconds a stopping agent still waits for the handlers it aborted to return their reply."""


class AgentWorker:
    """Serves one Agent with `concurrency` worker threads until `stop` is set."""

    def __init__(
        self,
        agent: Agent,
        transport: Transport,
        names: Names,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        limits: Limits = DEFAULT_LIMITS,
        stop: threading.Event | None = None,
        options: AgentOptions | None = None,
        pool: str | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        """`limits` bound the requests accepted (beyond them: dead-lettered) and the replies
        sent (beyond them: an `error` reply saying so); keep them within the scheduler's.
        With `pool`, it consumes that pool's queue (the steps that ask for the pool) instead
        of the agent's shared queue."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.id = process_id(f"agent-{agent.name}")
        self.agent = agent
        self._transport = transport
        self._names = names
        self._concurrency = concurrency
        self._pool_name = pool
        self._queue = names.agent_queue(agent.name, pool)
        self._limits = limits
        self._stop = stop or threading.Event()
        self._options = options or AgentOptions()
        self._hooks = guarded(hooks)
        self.fleet = FleetLink(
            self.id,
            agent.name,
            transport,
            names,
            concurrency=concurrency,
            interval=self._options.heartbeat_interval,
            actions=agent.uses(),
        )
        self._breakers = {
            dep: SharedBreaker(
                dep, policy, on_change=self.fleet.breaker_changed, observe=self._breaker_changed
            )
            for dep, policy in agent.breakers.items()
        }
        for dependency in self._breakers:  # observers learn every breaker, closed at start
            self._breaker_changed(dependency, "closed")
        self._threads: set[threading.Thread] = set()
        self._busy: set[threading.Thread] = set()
        self._threads_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=concurrency,
            thread_name_prefix=f"{agent.name}-worker",
            initializer=self._thread_started,
        )
        self._outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._held: list[Outcome] = []
        """Replies the broker returned, published again at `_retry_at` (owner thread)."""
        self._retry_at = 0.0
        self._retry_backoff = Reconnect(initial=0.5, maximum=5.0)
        self._jobs: dict[tuple[int, int], Job] = {}
        self.stats = AgentStats()
        self._progress = ProgressLink(transport, names, agent.name, self.stats)
        self._early_acks = EarlyAcks(transport, self._options.consumer_timeout, self.stats)

    @property
    def stop_event(self) -> threading.Event:
        return self._stop

    def breaker(self, dependency: str) -> SharedBreaker:
        return self._breakers[dependency]

    def _breaker_changed(self, dependency: str, state: str) -> None:
        self._hooks.breaker_changed(self.agent.name, dependency, state)

    def run(self) -> None:
        self._options.children.reap_orphans()
        try:
            serve_forever(
                self.id, self._serve, self._stop, Reconnect(), self._hooks.consumer_cancelled
            )
        finally:
            for job in self._jobs.values():
                job.call.cancelled.set()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._transport.close()
            self._join_idle_threads()
        log.info("%s stopped: %s", self.id, self.stats)

    def _thread_started(self) -> None:
        with self._threads_lock:
            self._threads.add(threading.current_thread())

    def _join_idle_threads(self, timeout: float = 5.0) -> None:
        """Wait for the pool threads that run no handler to exit, which they do at once after
        the shutdown: the CLI counts every thread still alive at exit as a hung handler."""
        with self._threads_lock:
            idle = self._threads - self._busy
        deadline = time.monotonic() + timeout
        for thread in idle:
            thread.join(max(0.0, deadline - time.monotonic()))

    # -- the owner thread -------------------------------------------------------------------

    def _serve(self) -> None:
        self._transport.connect()
        declare_common(self._transport, self._names)
        declare_agent_queue(self._transport, self._names, self.agent.name, self._pool_name)
        self._transport.consume(self._queue, self._on_request, prefetch=self._concurrency)
        self.fleet.connected(self._breakers)
        log.info("%s consuming %s with %d threads", self.id, self._queue, self._concurrency)
        while not self._stop.is_set():
            self._transport.process(self._next_wait())
            self._settle()
        self._drain()
        self.fleet.heartbeat(self._breakers, in_flight=len(self._jobs), stopping=True)

    def _drain(self) -> None:
        """Stop taking requests; interrupt retry sleeps (those steps are handed back as
        deferred); let calls in progress finish, each within its deadline, for at most the
        drain timeout; then abort them (their programs are killed) and leave what is still
        unanswered to the broker."""
        self._transport.cancel_consumers()
        for job in self._jobs.values():
            job.call.cancelled.set()
        timeout = self._options.drain_timeout
        until = None if timeout is None else time.monotonic() + timeout
        while self._jobs and (until is None or time.monotonic() < until):
            self._transport.process(self._next_wait(until))
            self._settle()
        if not self._jobs:
            return
        log.warning("%s: drain timeout: aborting %d running step(s)", self.id, len(self._jobs))
        for job in self._jobs.values():
            job.call.aborted.set()
        until = time.monotonic() + ABORT_SETTLE + DEFAULT_GRACE
        while self._jobs and time.monotonic() < until:
            self._transport.process(self._next_wait(until))
            self._settle()

    def _next_wait(self, limit: float | None = None) -> float:
        if not self._outcomes.empty():
            return 0.0
        deadlines = [j.call.deadline for j in self._jobs.values() if not j.abandoned]
        if limit is not None:
            deadlines.append(limit)
        deadlines.append(self.fleet.next_heartbeat)
        started_due = self._progress.next_due(self._jobs.values())
        if started_due is not None:
            deadlines.append(started_due)
        if self._held:
            deadlines.append(self._retry_at)
        until = min(deadlines, default=time.monotonic() + 0.5) - time.monotonic()
        return min(0.5, max(0.0, until))

    def _on_request(self, delivery: Delivery) -> None:
        received = time.monotonic()
        try:
            request = parse(Request, delivery.body, self._limits)
        except InvalidMessageError as exc:
            self._dead_letter(delivery, str(exc))
            return
        if request.agent != self.agent.name:
            self._dead_letter(
                delivery,
                f"Request: for agent {request.agent!r}, "
                f"delivered to the queue of {self.agent.name!r}",
            )
            return
        self.stats.received += 1
        # Until a worker takes it (progress.start times the budget from then), its deadline
        # is the whole envelope: the wait, then the execution.
        call = Call(
            input=request.input,
            idempotency_key=request.idempotency_key,
            attempt=request.attempt,
            deadline=received + ((request.wait_ms or 0) + request.budget_ms) / 1000,
            step_id=request.step_id,
            run_id=request.run_id,
            workflow=request.workflow,
            step=request.step,
            action=request.action,
            kind=request.kind,
            children=self._options.children,
        )
        job = Job(delivery, request, call, received=received)
        key = (request.step_id, request.attempt)
        running = self._jobs.get(key)
        if running is not None:
            # The same attempt already runs here. Redelivered after a reconnect: the new
            # delivery replaces the dead one and is acked after the reply (an exclusive one at
            # once). A duplicate on the same connection is acked now; the first copy is acked
            # after the reply.
            if running.delivery.generation != delivery.generation:
                running.delivery = delivery
                running.acked = request.exclusive and self._transport.ack(delivery)
            else:
                self._transport.ack(delivery)
            return
        self._jobs[key] = job
        spec = self.agent.spec(request.action)
        if spec is None:
            known = ", ".join(sorted(self.agent.actions)) or "none"
            reply = self._reply(
                request,
                ReplyStatus.ERROR,
                error=ErrorInfo(
                    type="UnknownActionError",
                    message=f"agent {self.agent.name!r} has no action {request.action!r} "
                    f"(it has: {known})",
                ),
            )
            self._outcomes.put(Outcome.of(job, reply, self._limits))
            return
        self._pool.submit(self._execute, job, spec)

    def _dead_letter(self, delivery: Delivery, reason: str) -> None:
        self._transport.dead_letter(
            delivery, reason, dead_letter_exchange=self._names.dead_letter_exchange
        )
        self.stats.dead_lettered += 1
        self._hooks.dead_lettered(delivery.queue, reason)

    def _settle(self) -> None:
        """Reply for finished jobs and abandon those whose deadline passed (owner thread)."""
        outcomes: list[Outcome] = []
        while True:
            try:
                outcomes.append(self._outcomes.get_nowait())
            except queue.Empty:
                break
        if self._held and time.monotonic() >= self._retry_at:
            outcomes += self._held
            self._held = []
            for outcome in outcomes:
                outcome.job.held = False
        if outcomes:
            self._finish(outcomes)
        self._progress.flush(self._jobs.values(), self._running)
        self._early_acks.settle(self._jobs.values())
        self.fleet.tick(self._breakers, in_flight=len(self._jobs))
        now = time.monotonic()
        for key, job in list(self._jobs.items()):
            if not job.abandoned and now >= job.call.deadline:
                job.abandoned = True
                job.call.cancelled.set()
                job.call.aborted.set()
                self.stats.abandoned += 1
                log.warning(
                    "step %s attempt %s passed its deadline %s: no reply",
                    job.request.step_id,
                    job.request.attempt,
                    "before its returned reply could be routed" if job.held else "while running",
                )
                if not job.acked:
                    self._transport.ack(job.delivery)
                del self._jobs[key]

    def _running(self, job: Job) -> bool:
        """Whether `job` still runs here with no reply ready (its progress is worth sending)."""
        key = (job.request.step_id, job.request.attempt)
        return self._jobs.get(key) is job and not (job.abandoned or job.held)

    def _finish(self, outcomes: list[Outcome]) -> None:
        """Publish the replies of finished jobs as one batch, then ack their requests.

        Replies are mandatory: one the broker returns (its queue is gone) is sent again after
        the namespace's queues are declared again, and if it comes back once more it is held,
        its request unacked, and retried until the step's deadline (`_hold`)."""
        done: list[Job] = []
        sending: list[Outcome] = []
        for outcome in outcomes:
            job = outcome.job
            if job.abandoned:
                continue
            done.append(job)
            if outcome.reply is not None and time.monotonic() < job.call.deadline:
                sending.append(outcome)
        try:
            refused = self._send(sending)
            if any(isinstance(exc, UnroutableError) for _, exc in refused):
                # `<ns>.replies` was deleted (or lost with its node) since we declared it.
                declare_common(self._transport, self._names)
                returned = [o for o, exc in refused if isinstance(exc, UnroutableError)]
                refused = [r for r in refused if not isinstance(r[1], UnroutableError)]
                refused += self._send(returned)
            # Refused for good (e.g. too large): report that instead.
            instead = [
                Outcome.of(
                    outcome.job,
                    self._reply(
                        outcome.job.request,
                        ReplyStatus.ERROR,
                        error=ErrorInfo(
                            type="PublishError", message=f"the broker refused the reply: {exc}"
                        ),
                    ),
                )
                for outcome, exc in refused
                if not isinstance(exc, UnroutableError)
            ]
            held = [o for o, exc in refused if isinstance(exc, UnroutableError)]
            unsent: list[Outcome] = []
            for outcome, exc in self._send(instead):
                (held if isinstance(exc, UnroutableError) else unsent).append(outcome)
        except BrokerUnavailableError:
            for outcome in outcomes:
                self._outcomes.put(outcome)  # publish them on the next connection
            raise
        for outcome in unsent:  # not even the error fits: the step's deadline will tell
            log.error(
                "step %s: the broker refused the error reply too", outcome.job.request.step_id
            )
        self._hold(held)
        # No reply, or finished too late, or refused twice: the pattern says stay silent.
        self.stats.silent += len(done) - len(sending) + len(unsent)
        for job in done:
            if job.held:
                continue
            self._jobs.pop((job.request.step_id, job.request.attempt), None)
            if not job.acked:
                self._transport.ack(job.delivery)

    def _hold(self, outcomes: list[Outcome]) -> None:
        """Keep replies the broker returned even after the queues were declared again (a
        `reply_to` queue that is not ours, or deleted again): their requests stay unacked,
        and they are published again after a backoff until the step's deadline, when the
        pattern's silence applies. Neither is the reply lost nor the handler run again
        (nacking the request would run it twice), unless this process ends meanwhile."""
        for outcome in outcomes:
            outcome.job.held = True
            self._held.append(outcome)
            log.error(
                "step %s attempt %s: the reply to %s was returned (no such queue); keeping the "
                "request and retrying until its deadline",
                outcome.job.request.step_id,
                outcome.job.request.attempt,
                outcome.job.delivery.reply_to or self._names.replies,
            )
        if outcomes:
            self._retry_at = time.monotonic() + self._retry_backoff.next_delay()
        elif not self._held:
            self._retry_backoff.reset()

    def _send(self, sending: list[Outcome]) -> list[tuple[Outcome, Exception]]:
        """Publish replies as one batch (mandatory); count those confirmed, return those
        refused (an UnroutableError: returned by the broker)."""
        if not sending:
            return []
        results = self._transport.publish_many(
            [
                Outgoing(
                    exchange="",
                    routing_key=outcome.job.delivery.reply_to or self._names.replies,
                    body=outcome.body,
                    correlation_id=outcome.job.delivery.correlation_id,
                    headers=outcome.job.reply_headers,
                    mandatory=True,
                )
                for outcome in sending
            ]
        )
        refused: list[tuple[Outcome, Exception]] = []
        for outcome, result in zip(sending, results, strict=True):
            reply = outcome.reply
            if isinstance(result, BrokerUnavailableError):
                raise result  # not sent: every outcome is published again after reconnecting
            if result is None:
                if reply is not None:
                    self._count(reply)
            else:
                log.error(
                    "step %s: the broker refused the %s reply: %s",
                    outcome.job.request.step_id,
                    reply.status if reply is not None else "",
                    result,
                )
                refused.append((outcome, result))
        return refused

    def _count(self, reply: Reply) -> None:
        if reply.status is ReplyStatus.OK:
            self.stats.replied_ok += 1
        elif reply.status is ReplyStatus.DEFERRED:
            self.stats.deferred += 1
        elif reply.status is ReplyStatus.FAILED:
            self.stats.replied_failed += 1
        else:
            self.stats.replied_error += 1

    def _reply(self, request: Request, status: ReplyStatus, **fields: Any) -> Reply:
        if "defer_seconds" in fields:
            fields["defer_seconds"] = min(fields["defer_seconds"], MAX_DEFER_SECONDS)
        error = fields.get("error")
        if isinstance(error, ErrorInfo):
            fields["error"] = ErrorInfo(
                type=safe_text(error.type, 200), message=safe_text(error.message)
            )
        return Reply.model_validate(
            {
                "step_id": request.step_id,
                "attempt": request.attempt,
                "status": status,
                "agent": self.agent.name,
                **fields,
            }
        )

    # -- worker threads -------------------------------------------------------------------

    def _is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, PermanentError | BreakerOpenError):
            return False
        return isinstance(exc, (TransientError, *self.agent.transient))

    def _after_transient(
        self, job: Job, breaker: SharedBreaker | None, exc: BaseException
    ) -> Reply | None:
        """Retries stopped on a transient error: say why, unless the deadline is (nearly) gone."""
        request = job.request
        error = ErrorInfo(type=type(exc).__name__, message=str(exc))
        open_for = breaker.open_for() if breaker is not None else None
        if open_for is not None:  # the failures tripped the breaker: park, do not count
            return self._reply(request, ReplyStatus.DEFERRED, defer_seconds=open_for, error=error)
        if job.call.cancelled.is_set():  # shutting down: hand the step back at once
            return self._reply(request, ReplyStatus.DEFERRED, defer_seconds=0.0, error=error)
        if job.call.remaining() <= 0:
            return None
        log.info(
            "step %s attempt %s: retries exhausted before the deadline (%s)",
            request.step_id,
            request.attempt,
            exc,
        )
        return self._reply(request, ReplyStatus.FAILED, error=error)

    def _execute(self, job: Job, spec: HandlerSpec) -> None:
        with self._threads_lock:
            self._busy.add(threading.current_thread())
        outcome = Outcome(job, None)
        started = time.monotonic()
        self._hooks.handler_started(job.request, job.delivery.headers)
        try:
            if job.call.cancelled.is_set() or job.call.remaining() <= 0 or waited_too_long(job):
                return  # waited here past its deadline or wait budget: never start it late
            if not ack_taken(self._transport, job, self.stats):
                return  # exclusive, and its connection is gone: the broker has it again
            job.call = self._progress.start(job)  # the execution clock runs from now
            outcome = Outcome.of(job, self._run_handler(job, spec), self._limits)
        except Exception:  # a bug of ours: the step is left to its deadline, but it is logged
            log.exception(
                "step %s attempt %s: the agent failed to run the handler",
                job.request.step_id,
                job.request.attempt,
            )
        finally:
            breaker = self._breakers.get(spec.dependency) if spec.dependency else None
            job.reply_headers = self._hooks.handler_finished(
                job.request,
                outcome.reply,
                time.monotonic() - started,
                breaker.state if breaker is not None else None,
            )
            # Idle before the owner can see the outcome, so it never waits on this thread.
            with self._threads_lock:
                self._busy.discard(threading.current_thread())
            self._outcomes.put(outcome)
            # Wake the owner thread; while it reconnects the outcome waits in the queue.
            with contextlib.suppress(BrokerUnavailableError):
                self._transport.call_threadsafe(lambda: None)

    def _run_handler(self, job: Job, spec: HandlerSpec) -> Reply | None:
        call, request = job.call, job.request
        breaker = self._breakers.get(spec.dependency) if spec.dependency else None

        def attempt() -> Any:
            if breaker is None:
                return spec.function(call)
            return breaker.call(lambda: spec.function(call), self._is_transient)

        try:
            output = retrying(
                spec.retry,
                budget=retry_budget(call.remaining()),
                is_transient=self._is_transient,
                interrupted=call.cancelled,
                on_retry=lambda exc, n: self._hooks.handler_retrying(request, exc, n),
            )(attempt)
        except BreakerOpenError as exc:
            return self._reply(
                request,
                ReplyStatus.DEFERRED,
                defer_seconds=exc.retry_after,
                error=ErrorInfo(type="BreakerOpen", message=str(exc)),
            )
        except Exception as exc:  # noqa: BLE001 - user code: every failure becomes a reply
            if self._is_transient(exc):
                return self._after_transient(job, breaker, exc)
            log.info(
                "step %s attempt %s failed permanently: %r", request.step_id, request.attempt, exc
            )
            return self._reply(
                request,
                ReplyStatus.ERROR,
                error=ErrorInfo(type=type(exc).__name__, message=str(exc)),
            )
        try:
            dumps(output)
        except InvalidMessageError as exc:
            return self._reply(
                request,
                ReplyStatus.ERROR,
                error=ErrorInfo(
                    type="InvalidOutputError", message=f"handler returned a non-JSON output: {exc}"
                ),
            )
        return self._reply(request, ReplyStatus.OK, output=output)
