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
from dataclasses import dataclass, field, replace
from typing import Any

from sasflow.agents.acks import DEFAULT_CONSUMER_TIMEOUT, EarlyAcks, ack_taken, waited_too_long
from sasflow.agents.agent import Agent, HandlerSpec
from sasflow.agents.cancels import Cancels
from sasflow.agents.children import DEFAULT_GRACE, ChildProcesses
from sasflow.agents.fleet import FleetLink
from sasflow.agents.handback import HandBacks, give_back_unstarted, lacks_action
from sasflow.agents.jobs import AgentStats, Job, Outcome
from sasflow.agents.progress import ProgressLink
from sasflow.agents.redelivery import Redeliveries
from sasflow.agents.replies import ReplySender, make_reply
from sasflow.agents.resilience import SharedBreaker
from sasflow.agents.running import HandlerRunner
from sasflow.agents.wedge import WEDGED_EXIT_CODE, Change, WedgeOptions, WedgeWatch
from sasflow.errors import BrokerUnavailableError, InvalidMessageError
from sasflow.hooks import Hooks, guarded
from sasflow.messages import (
    DEFAULT_LIMITS,
    Limits,
    Reply,
    Request,
    parse,
)
from sasflow.runtime import Reconnect, process_id, serve_forever
from sasflow.states import ReplyStatus
from sasflow.transport.base import Delivery, Transport
from sasflow.transport.topology import Names, declare_agent_queue, declare_common

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 4
"""Worker threads of an agent process, and requests it takes from its queue at once."""


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
    wedge: WedgeOptions = field(default_factory=WedgeOptions)
    """When threads held past deadline wedge the process, and when it exits (agents.wedge)."""


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
        self._hooks.threads_held(agent.name, 0, concurrency)
        self._threads: set[threading.Thread] = set()
        self._busy: set[threading.Thread] = set()
        self._threads_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=concurrency,
            thread_name_prefix=f"{agent.name}-worker",
            initializer=self._thread_started,
        )
        self._outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._jobs: dict[tuple[int, int], Job] = {}
        self.stats = AgentStats()
        self._replies = ReplySender(agent.name, transport, names, self.stats, self._jobs)
        self._handbacks = HandBacks()
        self._redeliveries = Redeliveries()
        self._wedge = WedgeWatch(concurrency, self._options.wedge)
        self.exit_code = 0
        """WEDGED_EXIT_CODE once it stopped because it stayed wedged too long."""
        self._progress = ProgressLink(transport, names, agent.name, self.stats)
        self._early_acks = EarlyAcks(transport, self._options.consumer_timeout, self.stats)
        self._runner = HandlerRunner(agent, self._breakers, self._hooks, self._reply)
        self._cancels = Cancels(
            self.id,
            agent.name,
            transport,
            names=names,
            jobs=self._jobs,
            stats=self.stats,
            dead_letter=self._dead_letter,
        )

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
            self._runner.close()
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
        if not self._wedge.wedged:
            self._transport.consume(self._queue, self._on_request, prefetch=self._concurrency)
        self._cancels.connected()
        self.fleet.connected(self._breakers)
        log.info("%s consuming %s with %d threads", self.id, self._queue, self._concurrency)
        while not self._stop.is_set():
            self._transport.process(self._next_wait())
            self._settle()
        self._drain()
        self.fleet.heartbeat(
            self._breakers, in_flight=len(self._jobs), held=self._wedge.held, stopping=True
        )

    def _drain(self) -> None:
        """Stop taking requests; interrupt retry sleeps (those steps are handed back as
        deferred); let calls in progress finish, each within its deadline, for at most the
        drain timeout; then abort them (their programs are killed) and leave what is still
        unanswered to the broker."""
        self._transport.cancel_consumers()
        self._give_back_unstarted()
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
        if self._replies.retry_at is not None:
            deadlines.append(self._replies.retry_at)
        wedge_due = self._wedge.next_due()
        if wedge_due is not None:
            deadlines.append(wedge_due)
        until = min(deadlines, default=time.monotonic() + 0.5) - time.monotonic()
        return min(0.5, max(0.0, until))

    def _on_request(self, delivery: Delivery) -> None:
        received, wall = time.monotonic(), time.time()
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
        self._redeliveries.received(request, delivery.redelivered, mono=received, wall=wall)
        job = Job.received_at(received, delivery, request, self._options.children)
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
        if self._cancels.came_first(request, delivery):
            return
        if request.exclusive and delivery.redelivered and not self._bound(job, wall):
            return
        spec = self.agent.spec(request.action)
        if spec is None:
            reply = lacks_action(
                self._handbacks,
                job,
                agent=self.agent,
                instance_id=self.id,
                transport=self._transport,
                stats=self.stats,
            )
            if reply is not None:
                self._jobs[key] = job
                self._outcomes.put(Outcome.of(job, reply, self._limits))
            return
        self._jobs[key] = job
        self._pool.submit(self._execute, job, spec)

    def _bound(self, job: Job, wall: float) -> bool:
        """A redelivered exclusive request (agents.redelivery): whether it may still run here,
        within its claim plus its budget; if not, it is acknowledged and never run (the
        database's clocks end its attempt)."""
        request = job.request
        if self._redeliveries.taken(request):
            why = "this process took that attempt already"
        else:
            job.latest_end = self._redeliveries.latest_end(request, mono=job.received, wall=wall)
            if job.latest_end is None or job.latest_end > job.received:
                if job.latest_end is not None:
                    job.call = replace(job.call, deadline=min(job.call.deadline, job.latest_end))
                return True
            why = f"its attempt's budget ended {job.received - job.latest_end:.3f}s ago"
        self._transport.ack(job.delivery)
        self.stats.redelivered_dropped += 1
        log.warning(
            "step %s attempt %s: redelivered request not run: %s (it may have run already; "
            "the step's deadline recovers it)",
            request.step_id,
            request.attempt,
            why,
        )
        return False

    def _give_back_unstarted(self) -> None:
        give_back_unstarted(self._handbacks, self._jobs, self._transport, self.stats)

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
        for outcome in outcomes:
            self._wedge.returned(outcome.job)
        # A cancelled attempt is never replied to (agents.cancels): its request is only acked.
        outcomes = [Outcome(o.job, None) if o.job.revoked else o for o in outcomes]
        outcomes += self._replies.due()
        if outcomes:
            self._finish(outcomes)
        self._progress.flush(self._jobs.values(), self._running)
        self._early_acks.settle(self._jobs.values())
        self.fleet.tick(self._breakers, in_flight=len(self._jobs), held=self._wedge.held)
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
                    _where(job),
                )
                if not job.acked:
                    self._transport.ack(job.delivery)
                del self._jobs[key]
                self._wedge.abandoned(job)
        self._watch_wedge()

    def _watch_wedge(self) -> None:
        """Stop consuming while every thread is held past deadline, resume when one is free,
        stop for a restart when wedged too long (agents.wedge)."""
        held = self._wedge.held
        change = self._wedge.check()
        if self._wedge.held != held:
            self._hooks.threads_held(self.agent.name, self._wedge.held, self._concurrency)
            self.fleet.next_heartbeat = 0.0  # the fleet view learns it with the next tick
        if change is Change.WEDGED:
            log.error(
                "%s wedged: all %d worker threads are held by handlers past their deadline; "
                "taking no requests until one returns",
                self.id,
                self._concurrency,
            )
            self._transport.cancel_consumers(self._queue)
            self._give_back_unstarted()
        elif change is Change.FREED:
            log.warning("%s: a worker thread is free again; taking requests", self.id)
            self._transport.consume(self._queue, self._on_request, prefetch=self._concurrency)
        elif change is Change.EXIT:
            log.critical(
                "%s wedged for %gs: stopping for a restart (exit status %d)",
                self.id,
                self._options.wedge.exit_after,
                WEDGED_EXIT_CODE,
            )
            self.exit_code = WEDGED_EXIT_CODE
            self._stop.set()

    def _running(self, job: Job) -> bool:
        """Whether `job` still runs here with no reply ready (its progress is worth sending)."""
        key = (job.request.step_id, job.request.attempt)
        return self._jobs.get(key) is job and not (job.abandoned or job.held or job.revoked)

    def _finish(self, outcomes: list[Outcome]) -> None:
        try:
            self._replies.finish(outcomes)
        except BrokerUnavailableError:
            for outcome in outcomes:
                self._outcomes.put(outcome)  # publish them on the next connection
            raise

    def _reply(self, request: Request, status: ReplyStatus, **fields: Any) -> Reply:
        return make_reply(self.agent.name, request, status, **fields)

    # -- worker threads -------------------------------------------------------------------

    def _execute(self, job: Job, spec: HandlerSpec) -> None:
        if not self._handbacks.take(job):
            return  # the owner thread handed it back to the broker meanwhile
        with self._threads_lock:
            self._busy.add(threading.current_thread())
        outcome = Outcome(job, None)
        started = time.monotonic()
        self._hooks.handler_started(job.request, job.delivery.headers)
        try:
            if job.revoked:
                return  # cancelled before a worker took it: never started
            if job.call.cancelled.is_set() and not job.abandoned:
                job.handed_back = True  # shutting down: another process runs it at once
                return
            if job.call.remaining() <= 0 or waited_too_long(job):
                return  # waited here past its deadline or wait budget: never start it late
            if not ack_taken(self._transport, job, self.stats):
                return  # exclusive, and its connection is gone: the broker has it again
            job.call = self._progress.start(job)  # the execution clock runs from now
            if job.request.exclusive:
                if job.latest_end is not None:  # redelivered: within its claim's budget
                    job.call = replace(job.call, deadline=min(job.call.deadline, job.latest_end))
                self._redeliveries.took(job.request, job.call.deadline)
            outcome = Outcome.of(job, self._runner.run(job, spec), self._limits)
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


def _where(job: Job) -> str:
    """Where a job was when its deadline passed, for the log."""
    if job.held:
        return "before its returned reply could be routed"
    if not job.taken:
        return "waiting here for a free worker thread (never started)"
    return "while running"
