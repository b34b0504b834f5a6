"""`async def` handlers: one event loop per agent process, in a thread of its own.

The worker thread that took the request submits the handler's coroutine to the loop
(`asyncio.run_coroutine_threadsafe`) and waits for it, so the agent's concurrency still bounds
the steps in flight and retries, breakers and replies work as for a plain function. The
coroutine runs under the step's deadline: when it passes, or when the agent gives up on the
call (`call.aborted`: the drain timeout of a stopping agent ran out), its task is cancelled
(`asyncio.CancelledError` inside the handler). `call.cancelled` stays advisory, as for a
plain handler: a stopping agent lets running steps finish within their deadline.

The loop starts with the first coroutine, so an agent of plain handlers runs no extra thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from typing import Any

from sasflow.agents.agent import Call
from sasflow.agents.errors import TransientError

log = logging.getLogger(__name__)

ABORT_POLL = 0.05
"""Seconds between two looks at `call.aborted` while a coroutine runs (its deadline is timed
by the loop itself, exactly)."""
CANCEL_GRACE = 1.0
"""Seconds a cancelled coroutine has to finish its cleanup before the worker stops waiting."""


class DeadlinePassedError(TransientError):
    """The step's deadline passed while its async handler ran: its task was cancelled."""


class AbortedError(TransientError):
    """The agent gave up on the call (its drain timeout ran out): its task was cancelled."""


class HandlerLoop:
    """The agent process's event loop for `async def` handlers."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name=f"{self._name}-loop", daemon=True
                )
                running = threading.Event()
                loop.call_soon(running.set)
                thread.start()
                running.wait()  # `run` reads a loop that is not running as a closed one
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, Any], call: Call) -> Any:
        """Run `coroutine` on the loop until it returns, raises, or is cancelled at the step's
        deadline (DeadlinePassedError) or when the call is aborted or the loop closed
        (AbortedError)."""
        loop = self._running_loop()
        future = asyncio.run_coroutine_threadsafe(_within(coroutine, call.remaining()), loop)
        while True:
            try:
                return future.result(timeout=ABORT_POLL)
            except concurrent.futures.CancelledError:  # the loop was closed under it
                raise AbortedError from None
            except concurrent.futures.TimeoutError:
                if call.aborted.is_set() or not loop.is_running():  # given up, or closed
                    break
        future.cancel()
        try:
            future.result(timeout=CANCEL_GRACE)
        except concurrent.futures.CancelledError:
            pass
        except concurrent.futures.TimeoutError:
            log.warning(
                "step %s attempt %s: its async handler did not stop within %.0fs of being "
                "cancelled",
                call.step_id,
                call.attempt,
                CANCEL_GRACE,
            )
        raise AbortedError

    def close(self) -> None:
        """Stop the loop (its pending tasks are cancelled) and join its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(_cancel_all_then_stop, loop)
        thread.join(CANCEL_GRACE + 1.0)
        if not thread.is_alive():
            loop.close()


async def _within(coroutine: Coroutine[Any, Any, Any], seconds: float) -> Any:
    task = asyncio.ensure_future(coroutine)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:  # the call was aborted: cancel the handler's task too
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_GRACE)
        raise
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.wait({task}, timeout=CANCEL_GRACE)
    raise DeadlinePassedError


def _cancel_all_then_stop(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.call_later(0.1, loop.stop)
