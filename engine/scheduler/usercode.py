"""Workflows' user code run off the scheduler's loop: input builders and `Workflow.output`, each
call a job of a small thread pool with a time budget.

The loop only submits jobs and reads their results; it never waits for one. A job that raises,
returns what is not JSON or is still running when its budget ends is a `BuildFailed` with the
reason (its step fails, or its run for the output). A thread cannot be stopped: one whose
code never returns keeps its pool thread, its result discarded when it comes; the pool's other
threads go on, and runs whose steps take the run's input never wait for the pool at all.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sasflow.commands import StoredError
from sasflow.errors import InvalidMessageError
from sasflow.messages import dumps
from sasflow.store.runs.decide import BuildFailed
from sasflow.workflow import JSON, StepContext, Workflow

OUTPUT = "<output>"
"""The job key of the run's output (step names cannot contain '<')."""


@dataclass(frozen=True)
class UserCodeOptions:
    """The pool of one scheduler (`sasflow scheduler --builder-*`)."""

    threads: int = 4
    budget_s: float = 10.0
    """Seconds one call of an input builder or output builder may take; past them its step
    (or run, for the output) fails with the reason."""


@dataclass
class Job:
    """One call of user code for one run: a step's input builder, or its output (`OUTPUT`)."""

    run_id: int
    key: str
    future: Future[Any]
    deadline: float
    """Monotonic: the job's time budget is a duration on this process, not a time of the
    database."""

    def result(self, now: float, budget_s: float) -> Any | BuildFailed | None:
        """Its result, a BuildFailed, or None while it runs within its budget."""
        if self.future.done():
            exc = self.future.exception()
            if exc is None:
                return self.future.result()
            return BuildFailed(_failure(self.key, exc))
        if now < self.deadline:
            return None
        self.future.cancel()  # never started (a full pool): it never will
        what = "run output builder" if self.key == OUTPUT else f"step {self.key!r}: input builder"
        return BuildFailed(
            StoredError("BuilderTimeoutError", f"{what} exceeded its time budget of {budget_s}s")
        )


def _failure(key: str, exc: BaseException) -> StoredError:
    if key == OUTPUT:
        message = f"run output builder raised {type(exc).__name__}: {exc}"
        return StoredError("InvalidOutputError", message)
    if isinstance(exc, InvalidMessageError):
        return StoredError("InvalidInputError", f"step {key!r}: input is not JSON: {exc}")
    message = f"step {key!r}: input builder raised {type(exc).__name__}: {exc}"
    return StoredError("InvalidInputError", message)


class UserCode:
    """The pool; `on_done` is called from a pool thread when a job ends (to wake the loop).

    Its threads are daemons (not concurrent.futures' pool, whose threads the interpreter joins
    at exit): a builder that never returns must not keep a stopped scheduler alive."""

    def __init__(self, options: UserCodeOptions, on_done: Callable[[], None]) -> None:
        self.options = options
        self._on_done = on_done
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []

    def submit(self, workflow: Workflow, run_id: int, key: str, ctx: StepContext) -> Job:
        """Start the call of `key` (a step's name or OUTPUT) for run `run_id`."""
        if not self._threads:  # started on first use: most schedulers never need them
            for i in range(self.options.threads):
                thread = threading.Thread(
                    target=self._work, name=f"sasflow-usercode-{i}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        call = _output if key == OUTPUT else _input
        future: Future[Any] = Future()
        future.add_done_callback(lambda _: self._on_done())
        self._queue.put((future, lambda: call(workflow, key, ctx)))
        return Job(run_id, key, future, time.monotonic() + self.options.budget_s)

    def close(self) -> None:
        """Stop the threads once their current call returns (not waited for: it may never)."""
        for _ in self._threads:
            self._queue.put(None)
        self._threads = []

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue  # cancelled: its budget ended before a thread was free
            try:
                future.set_result(call())
            except BaseException as exc:  # noqa: BLE001 - user code: reported as its failure
                future.set_exception(exc)


def _input(workflow: Workflow, step: str, ctx: StepContext) -> JSON:
    value = workflow.step(step).input(ctx)
    dumps(value)
    return value


def _output(workflow: Workflow, _: str, ctx: StepContext) -> JSON:
    value = workflow.output(ctx)
    dumps(value)
    return value
