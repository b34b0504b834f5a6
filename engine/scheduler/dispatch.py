"""The scheduler's dispatch: claim a batch of ready steps and publish their requests.

The claim is one statement in one transaction; the requests are published only after it
committed, as one batch settled by a single wait for the broker's confirms. Before the claim,
the in-flight bound (engine/scheduler/inflight.py) leaves out the agents this scheduler already
keeps busy; after it, the pool gate (engine/scheduler/pools.py) holds back the steps whose pool
has no agent. A request the broker refuses fails its step; a batch the broker may not have
taken is handed back (released) for any scheduler to claim again.

The agents that flow control covers (engine/scheduler/flow.py: limits, the fleet bound, open
breakers) are left out of that claim and claimed by the budgeted claim (store/flow/claim.py)
in a transaction of its own; the agents with no live instance by neither. With no limit and no
agent fleet, the claim is the plain statement alone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from sasflow.commands import StoredError
from sasflow.errors import (
    BrokerUnavailableError,
    PublishError,
    StoreUnavailableError,
    UnroutableError,
)
from sasflow.messages import Request, safe_text
from sasflow.scheduler.context import Context, Part
from sasflow.scheduler.flow import FlowDuty
from sasflow.scheduler.inflight import InFlightCap
from sasflow.scheduler.options import SchedulerOptions
from sasflow.scheduler.outbox import RelayDuty
from sasflow.scheduler.pools import PoolGate
from sasflow.scheduler.replies import Replies
from sasflow.states import StepKind
from sasflow.store.db import transaction
from sasflow.store.flow.claim import BudgetedClaim, claim_budgeted
from sasflow.store.runs import pools
from sasflow.store.runs.claim import ClaimedStep, claim, in_flight, release_steps
from sasflow.transport.base import Outgoing
from sasflow.transport.topology import declare_agent_queue

log = logging.getLogger(__name__)

CAPPED_RECHECK = 0.1
"""Seconds until a scheduler with an agent at its in-flight bound counts again: the replies
that free room may be applied by another scheduler (one reply queue for all), which does not
wake this one."""


@dataclass
class Claimed:
    """What one claim pass says of the next."""

    full: bool = False
    """The plain claim took a full batch: more may be ready."""
    due: float | None = None
    """Seconds until the earliest backoff ends (a retry is claimed when it is due, not at the
    next rescan)."""
    flow_full: bool = False
    """The budgeted claim may admit more now."""
    flow_due: float | None = None
    """Seconds until the budgeted claim may admit more (a rate's next call, a breaker's hold
    ending; None: nothing to wait for but a reply or a notification)."""


class Dispatcher(Part):
    """Claims and publishes; owned by the loop's thread."""

    def __init__(
        self,
        ctx: Context,
        options: SchedulerOptions,
        *,
        rescan_interval: float,
        in_flight: InFlightCap,
        replies: Replies,
        outbox: RelayDuty,
        flow: FlowDuty,
    ) -> None:
        super().__init__(ctx)
        self._batch = options.claim_batch
        self._flow = flow
        self._pool_limits = replace(options.pool_limits, recheck_s=rescan_interval)
        self._in_flight = in_flight
        self._pools = PoolGate(ctx.transport, ctx.names)
        self._fail = replies.fail
        self._outbox = outbox
        self._declared_agents: set[str] = set()

    def connected(self) -> None:
        """After (re)connecting: declare the app's agent queues (again)."""
        self._declared_agents.clear()
        self._pools.reset()
        for agent in self._registry.agents:
            self._declare_agent(agent.name)

    def claim_and_dispatch(self, *, plain: bool = True, budgeted: bool = True) -> Claimed:
        """Claim one batch and publish it: the plain claim's and the budgeted claim's (either
        may be left out); see `Claimed` for what it returns."""
        batch = self._batch
        plan = self._flow.plan
        claimed: list[ClaimedStep] = []
        done = Claimed()
        skip = list(self._in_flight.left_out)
        if plain:
            started = time.monotonic()
            with transaction(self._engine) as conn:
                if self._in_flight.needs_count(batch):
                    skip = self._in_flight.counted(in_flight(conn, locked_by=self._id))
                    if self._in_flight.all_capped(a.name for a in self._registry.agents):
                        # Nothing to claim, and a claim would walk every pending step to find it.
                        return Claimed(due=CAPPED_RECHECK)
                left_out = skip + sorted(plan.agents | plan.paused)
                claimed, done.due = claim(
                    conn, locked_by=self._id, batch=batch, skip_agents=left_out
                )
                self._hooks.steps_claimed(conn, claimed, time.monotonic() - started)
            done.full = len(claimed) == batch
        if budgeted and plan.agents:
            got = self._claim_budgeted(skip)
            claimed += got.claimed
            done.flow_full, done.flow_due = got.full, got.due
        if self._in_flight.capped:
            done.due = CAPPED_RECHECK if done.due is None else min(done.due, CAPPED_RECHECK)
        if claimed:
            self._dispatch(claimed)
        return done

    def _claim_budgeted(self, skip: list[str]) -> BudgetedClaim:
        started = time.monotonic()
        with transaction(self._engine) as conn:
            got = claim_budgeted(
                conn, self._flow.plan, locked_by=self._id, batch=self._batch, skip_agents=skip
            )
            self._hooks.steps_claimed(conn, got.claimed, time.monotonic() - started)
        self._flow.limited = bool(got.held) or got.limited
        self._hooks.steps_budgeted(got.admitted, got.held, got.tokens)
        return got

    def _dispatch(self, claimed: list[ClaimedStep]) -> None:
        """Publish the claimed steps' requests (see the module docstring)."""
        claimed_at = time.monotonic()
        self._stats.claimed += len(claimed)
        self._outbox.claimed()  # their events go out soon (RelayDuty.claimed says when)
        claimed = self._wait_for_pools(claimed)
        if not claimed:
            return
        try:
            results = self._transport.publish_many(
                [self._request(step, claimed_at) for step in claimed]
            )
        except BrokerUnavailableError as exc:
            # None of the batch may be assumed delivered; a request that did arrive is
            # fenced by its attempt (the re-claim increments it), so its reply is dropped.
            self._hand_back(claimed, f"request not published: {exc}")
            raise
        unsent = self._settle(claimed, results, claimed_at)
        if unsent:
            self._hand_back(unsent, "request not published: the broker closed the channel")
            raise BrokerUnavailableError("the broker closed the channel while dispatching")

    def _settle(
        self, claimed: list[ClaimedStep], results: list[Exception | None], claimed_at: float
    ) -> list[ClaimedStep]:
        """Book each request's publish result; returns the steps whose request is not known to
        have reached the broker (the channel closed first)."""
        unsent: list[ClaimedStep] = []
        unrouted: list[ClaimedStep] = []
        for step, result in zip(claimed, results, strict=True):
            if isinstance(result, UnroutableError):
                unrouted.append(step)
            elif isinstance(result, PublishError):
                # The broker refused this request (e.g. too large): retrying cannot help.
                self._fail_unpublishable(step, result)
            elif result is None:
                self._stats.dispatched += 1
                self._in_flight.dispatched(step.agent)
            else:
                unsent.append(step)
        dispatched = len(claimed) - len(unsent) - len(unrouted)
        self._hooks.steps_dispatched(dispatched, time.monotonic() - claimed_at)
        if unrouted:
            self._requeue_unrouted(unrouted)
        return unsent

    def _wait_for_pools(self, claimed: list[ClaimedStep]) -> list[ClaimedStep]:
        """The claimed steps that may be dispatched; those whose pool has no agent wait for
        a later pass, or fail past the pool limits (engine/scheduler/pools.py)."""
        try:
            ready, waiting = self._pools.split(claimed)
        except BrokerUnavailableError:
            self._release(claimed, "pool queues not checked: broker unavailable")
            raise
        if waiting:
            with transaction(self._engine) as conn:
                parked = set(
                    pools.park(
                        conn, [s.id for s in waiting], locked_by=self._id, limits=self._pool_limits
                    )
                )
            for step in waiting:
                if step.id not in parked:
                    error = StoredError("NoAgentInPool", f"no agent in pool {step.pool}")
                    self._fail(step.id, step.attempt, error)
        return ready

    def _request(self, step: ClaimedStep, claimed_at: float) -> Outgoing:
        # The wait clock started at the claim (docs/timeouts.md): the time spent until this
        # publish is the wait's, and the agent gets the whole execution budget once it starts.
        elapsed_ms = (time.monotonic() - claimed_at) * 1000
        wait_ms = max(1, int(step.wait_timeout_s * 1000 - elapsed_ms))
        heartbeat_s = step.heartbeat_timeout_s
        request = Request(
            step_id=step.id,
            run_id=step.run_id,
            attempt=step.attempt,
            workflow=step.workflow,
            step=step.name,
            agent=step.agent,
            action=step.action,
            kind=StepKind(step.kind),
            input=step.input,
            idempotency_key=step.idempotency_key,
            budget_ms=max(1, int(step.timeout_s * 1000)),
            complete_by=step.complete_by.isoformat(),
            wait_ms=wait_ms,
            heartbeat_ms=None if heartbeat_s is None else max(1, int(heartbeat_s * 1000)),
            exclusive=self._flow.plan.exclusive(step.agent, step.action),
            map_index=step.map_index,
            map_size=step.map_size,
        )
        if step.agent not in self._declared_agents:
            self._declare_agent(step.agent)
        return Outgoing(
            exchange="",
            routing_key=self._names.agent_queue(step.agent, step.pool),
            body=request.encode(),
            expiration_ms=wait_ms,
            correlation_id=f"{step.id}:{step.attempt}",
            reply_to=self._names.replies,
            mandatory=True,
            headers=self._hooks.request_headers(step),
        )

    def _requeue_unrouted(self, steps: list[ClaimedStep]) -> None:
        """The agent's queue is gone (deleted by hand, or with a lost node): not the step's
        fault. Release the steps uncharged and declare the queue again at their next claim, so
        the requests wait there for an agent instead of failing their runs for good."""
        agents = sorted({s.agent for s in steps})
        log.warning(
            "%s: no queue for agent(s) %s (deleted?): %d step(s) released, their queues are "
            "declared again at the next claim",
            self._id,
            ", ".join(agents),
            len(steps),
        )
        self._declared_agents.difference_update(agents)
        self._release(steps, "request not routed: the agent's queue was missing; declared again")

    def _fail_unpublishable(self, step: ClaimedStep, exc: PublishError) -> None:
        log.error("%s: step %s cannot be dispatched: %s", self._id, step.id, exc)
        error = StoredError("PublishError", safe_text(f"request refused by the broker: {exc}"))
        self._fail(step.id, step.attempt, error)

    def _declare_agent(self, agent: str) -> None:
        declare_agent_queue(self._transport, self._names, agent)
        self._declared_agents.add(agent)

    def _hand_back(self, steps: list[ClaimedStep], reason: str) -> None:
        """Release the steps whose request the broker may or may not have taken, except those a
        concurrency limit covers: released, their slot would be free while the request they
        may have left in the queue can still run. They stay `processing`, holding it, until
        their wait clock returns them (uncharged) or their agent answers."""
        plan = self._flow.plan
        held = [s for s in steps if plan.exclusive(s.agent, s.action)]
        if held:
            log.warning(
                "%s: %d step(s) under a concurrency limit kept processing (%s): their wait "
                "clock returns them if no agent takes their request",
                self._id,
                len(held),
                reason,
            )
        self._release([s for s in steps if not plan.exclusive(s.agent, s.action)], reason)

    def _release(self, steps: list[ClaimedStep], reason: str) -> None:
        try:
            with transaction(self._engine) as conn:
                self._stats.released += release_steps(
                    conn, steps, locked_by=self._id, reason=reason
                )
        except StoreUnavailableError:
            log.warning(
                "%s could not release %d steps; the supervisor will recover them",
                self._id,
                len(steps),
            )
