"""Running one attempt of a handler in a worker thread and turning its outcome into a reply:
retries of transient failures (with a `Retry-After` honoured), the dependency's breaker,
`async def` handlers on the agent's event loop, a handler's `Defer`, and the error with its
traceback. The worker (sasflow.agents.worker) owns the job; this module never touches pika."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, Protocol

from sasflow.agents.agent import Agent, Call, HandlerSpec
from sasflow.agents.aio import HandlerLoop
from sasflow.agents.errors import BreakerOpenError, Defer
from sasflow.agents.jobs import Job, retry_budget
from sasflow.agents.resilience import SharedBreaker, retrying
from sasflow.agents.tracebacks import handler_traceback
from sasflow.errors import InvalidMessageError
from sasflow.hooks import Hooks
from sasflow.messages import ErrorInfo, Reply, Request, dumps
from sasflow.states import ReplyStatus

log = logging.getLogger(__name__)


class MakeReply(Protocol):
    def __call__(self, request: Request, status: ReplyStatus, **fields: Any) -> Reply: ...


class HandlerRunner:
    """Runs handlers of one agent: shared by the worker threads of its process."""

    def __init__(
        self,
        agent: Agent,
        breakers: dict[str, SharedBreaker],
        hooks: Hooks,
        reply: MakeReply,
    ) -> None:
        self._agent = agent
        self._breakers = breakers
        self._hooks = hooks
        self._reply = reply
        self.loop = HandlerLoop(agent.name)
        """The event loop of `async def` handlers (started by the first one)."""

    def close(self) -> None:
        self.loop.close()

    def _invoke(self, function: Callable[[Call], Any], call: Call) -> Any:
        result = function(call)
        if inspect.iscoroutine(result):
            return self.loop.run(result, call)
        return result

    def run(self, job: Job, spec: HandlerSpec) -> Reply | None:
        """The reply to one attempt (None: stay silent, its deadline passed)."""
        call, request = job.call, job.request
        breaker = self._breakers.get(spec.dependency) if spec.dependency else None
        agent = self._agent

        def attempt() -> Any:
            if breaker is None:
                return self._invoke(spec.function, call)
            return breaker.call(lambda: self._invoke(spec.function, call), agent.is_transient)

        try:
            output = retrying(
                spec.retry,
                budget=retry_budget(call.remaining()),
                is_transient=agent.is_transient,
                interrupted=call.cancelled,
                on_retry=lambda exc, n: self._hooks.handler_retrying(request, exc, n),
                retry_after=agent.retry_after,
            )(attempt)
        except BreakerOpenError as exc:
            return self._reply(
                request,
                ReplyStatus.DEFERRED,
                defer_seconds=exc.retry_after,
                error=ErrorInfo(type="BreakerOpen", message=str(exc)),
            )
        except Defer as exc:
            log.info(
                "step %s attempt %s deferred by its handler for %.1fs: %s",
                request.step_id,
                request.attempt,
                exc.seconds,
                exc.reason,
            )
            return self._reply(
                request,
                ReplyStatus.DEFERRED,
                defer_seconds=exc.seconds,
                error=ErrorInfo(type="Deferred", message=exc.reason),
            )
        except Exception as exc:  # noqa: BLE001 - user code: every failure becomes a reply
            error = ErrorInfo(
                type=type(exc).__name__,
                message=str(exc),
                traceback=handler_traceback(exc, spec.function),
            )
            if agent.is_transient(exc):
                return self._after_transient(job, breaker, exc, error)
            log.info(
                "step %s attempt %s failed permanently: %r", request.step_id, request.attempt, exc
            )
            return self._reply(request, ReplyStatus.ERROR, error=error)
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

    def _after_transient(
        self, job: Job, breaker: SharedBreaker | None, exc: BaseException, error: ErrorInfo
    ) -> Reply | None:
        """Retries stopped on a transient error: say why, unless the deadline is (nearly) gone."""
        request = job.request
        open_for = breaker.open_for() if breaker is not None else None
        if open_for is not None:  # the failures tripped the breaker: park, do not count
            return self._reply(request, ReplyStatus.DEFERRED, defer_seconds=open_for, error=error)
        if job.call.cancelled.is_set():  # shutting down: hand the step back at once
            return self._reply(request, ReplyStatus.DEFERRED, defer_seconds=0.0, error=error)
        remaining = job.call.remaining()
        if remaining <= 0:
            return None
        asked = self._agent.retry_after(exc)
        if asked is not None and asked >= retry_budget(remaining):
            # The service said when to come back, and that is past this attempt's deadline:
            # come back then, without counting a failure.
            log.info(
                "step %s attempt %s: deferred %.1fs as the service asked (Retry-After)",
                request.step_id,
                request.attempt,
                asked,
            )
            return self._reply(request, ReplyStatus.DEFERRED, defer_seconds=asked, error=error)
        log.info(
            "step %s attempt %s: retries exhausted before the deadline (%s)",
            request.step_id,
            request.attempt,
            exc,
        )
        return self._reply(request, ReplyStatus.FAILED, error=error)
