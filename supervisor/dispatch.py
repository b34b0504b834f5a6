"""Deliver raised alerts to the sinks: the `alerts` table is the outbox, `notified_at` its mark.

How it behaves, and the decisions behind it:

- **At least once per sink attempt.** An alert is marked notified (`notified_at = now()`, in
  the transaction that selected it) only after every sink has finished its attempt. A crash
  before that commit sends the alert again, to every sink, on the next dispatch.
- **A failed attempt still counts.** A sink that raises (a webhook that exhausted its retries,
  an SMTP relay that refused) is logged at ERROR with the alert id, and the alert is marked
  notified all the same: one dead sink must not block the other sinks, nor every later alert,
  forever. The log and `sasflow alerts list` remain the record of what was raised.
- **A slow sink blocks nobody.** Each sink has its own worker thread and takes alerts in
  order; sinks work in parallel. `dispatch_pending(budget_s)` returns when every attempt of
  the batch finished or the budget is used, whichever comes first. Attempts still queued or
  running then carry on; their alerts stay unmarked (and locked rows are released), and the
  next dispatch waits for those same attempts instead of starting new ones, so a sink slower
  than the budget neither loses alerts nor receives them twice from this process. (A second
  supervisor process may send them again: at least once.)
- **Never in the caller's way.** `start()` runs dispatching in a daemon thread that waits on
  an event (`wake()`, or every `interval` seconds); the supervisor's sweep only calls `wake()`.
  A database outage inside the thread is logged and retried at the next interval; nothing
  ends the thread but `stop()`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, wait

from sasflow.errors import StoreUnavailableError
from sasflow.hooks import Hooks, guarded
from sasflow.store.db import Engine, transaction
from sasflow.store.outbox.alerts import set_notified, take_unnotified
from sasflow.supervisor.sinks import AlertRecord, Closable, Sink

log = logging.getLogger(__name__)

BATCH = 100
STOP_CHECK = 0.1


class _SinkWorker:
    """One sink's thread: its sends run in order, and only this thread touches its connection."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self._queue: queue.SimpleQueue[tuple[Future[None], AlertRecord] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    def submit(self, alert: AlertRecord) -> Future[None]:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run,
                args=(self._queue,),
                daemon=True,
                name=f"sasflow-alert-sink-{self.sink.name}",
            )
            self._thread.start()
        future: Future[None] = Future()
        future.add_done_callback(lambda f: self._report(alert, f))
        self._queue.put((future, alert))
        return future

    def _run(self, work: queue.SimpleQueue[tuple[Future[None], AlertRecord] | None]) -> None:
        while (item := work.get()) is not None:
            future, alert = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                self.sink.send(alert)
            except Exception as exc:  # noqa: BLE001 - every failure is reported by _report
                future.set_exception(exc)
            else:
                future.set_result(None)
        if isinstance(self.sink, Closable):
            try:
                self.sink.close()
            except Exception:
                log.exception("closing alert sink %s failed", self.sink.name)

    def _report(self, alert: AlertRecord, future: Future[None]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None:
            log.debug("alert %d sent to %s", alert.id, self.sink.name)
        else:
            log.error(
                "alert %d (%s) not delivered by sink %s: %s",
                alert.id,
                alert.kind,
                self.sink.name,
                exc,
            )

    def stop(self, timeout: float) -> None:
        """Finish the queued sends (within `timeout`), close the sink; a later submit restarts."""
        thread, self._thread = self._thread, None
        work, self._queue = self._queue, queue.SimpleQueue()
        if thread is None:
            return
        work.put(None)
        thread.join(timeout)
        if thread.is_alive():
            log.warning(
                "alert sink %s still busy after %.1fs; abandoning it", self.sink.name, timeout
            )


class AlertDispatcher:
    """Sends alerts not yet notified to every sink (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        sinks: Sequence[Sink],
        *,
        namespace: str,
        interval: float = 2.0,
        budget: float = 10.0,
        hooks: Hooks | None = None,
    ) -> None:
        self._hooks = guarded(hooks)
        self._engine = engine
        self._sinks = list(sinks)
        self._namespace = namespace
        self._interval = interval
        self._budget = budget
        self._workers = [_SinkWorker(s) for s in self._sinks]
        # (alert id, sink index) -> the attempt: remembered until the alert is marked notified.
        self._attempts: dict[tuple[int, int], Future[None]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def dispatch_pending(self, budget_s: float) -> int:
        """Send pending alerts for at most `budget_s` seconds; returns how many were marked
        notified. Raises StoreUnavailableError when the database cannot be reached."""
        return self._dispatch(budget_s, interruptible=False)

    def _dispatch(self, budget_s: float, *, interruptible: bool) -> int:
        deadline = time.monotonic() + budget_s
        marked = 0
        with self._lock:
            while time.monotonic() < deadline:
                count, more = self._dispatch_batch(deadline, interruptible=interruptible)
                marked += count
                if not more or (interruptible and self._stopping.is_set()):
                    break
        return marked

    def _dispatch_batch(self, deadline: float, *, interruptible: bool) -> tuple[int, bool]:
        """One batch in one transaction; returns (alerts marked, whether more may be waiting)."""
        with transaction(self._engine) as conn:
            rows = take_unnotified(conn, limit=BATCH)
            records = [AlertRecord.from_row(r, self._namespace) for r in rows]
            self._forget_except({r.id for r in records}, complete=len(rows) < BATCH)
            attempts = {
                r.id: [self._attempt(r, i) for i in range(len(self._workers))] for r in records
            }
            self._wait(
                [f for fs in attempts.values() for f in fs], deadline, interruptible=interruptible
            )
            done = [alert_id for alert_id, fs in attempts.items() if all(f.done() for f in fs)]
            if done:
                set_notified(conn, done)
                for kind in (r.kind for r in records if r.id in set(done)):
                    self._hooks.alert_raised(kind)
        for alert_id in done:
            for index in range(len(self._workers)):
                self._attempts.pop((alert_id, index), None)
        return len(done), len(rows) == BATCH and len(done) == len(rows)

    def _wait(self, futures: list[Future[None]], deadline: float, *, interruptible: bool) -> None:
        # The background thread looks at `stop()` every STOP_CHECK seconds while sinks work.
        while (remaining := deadline - time.monotonic()) > 0:
            slice_s = min(remaining, STOP_CHECK) if interruptible else remaining
            if not wait(futures, timeout=slice_s).not_done:
                return
            if interruptible and self._stopping.is_set():
                return

    def _attempt(self, alert: AlertRecord, index: int) -> Future[None]:
        future = self._attempts.get((alert.id, index))
        if future is None:
            future = self._attempts[alert.id, index] = self._workers[index].submit(alert)
        return future

    def _forget_except(self, pending: set[int], *, complete: bool) -> None:
        # Attempts of alerts someone else marked notified meanwhile; only knowable when the
        # batch held every pending alert.
        if complete:
            for key in [k for k in self._attempts if k[0] not in pending]:
                del self._attempts[key]

    def start(self) -> None:
        """Dispatch in a daemon thread until `stop()`; `wake()` makes it look at once."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._loop, daemon=True, name="sasflow-alert-dispatcher"
        )
        self._thread.start()

    def wake(self) -> None:
        """New alerts were raised: dispatch now rather than at the next interval."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread, then let the sinks finish what they hold and close their
        connections, all within about `timeout` seconds."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("alert dispatcher still busy after %.1fs; abandoning it", timeout)
            self._thread = None
        for worker in self._workers:
            worker.stop(max(0.0, deadline - time.monotonic()))
        # Attempts that did not finish are forgotten: their alerts stay unnotified and are
        # sent again by the next dispatch (or process).
        if self._lock.acquire(timeout=1.0):
            try:
                for future in self._attempts.values():
                    future.cancel()
                self._attempts.clear()
            finally:
                self._lock.release()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            more = False
            try:
                started = time.monotonic()
                marked = self._dispatch(self._budget, interruptible=True)
                more = time.monotonic() - started >= self._budget
                if marked:
                    log.info("%d alert(s) delivered", marked)
            except StoreUnavailableError as exc:
                log.warning("alerts not dispatched: %s; retrying in %.1fs", exc, self._interval)
            except Exception:
                log.exception("alert dispatch failed; retrying in %.1fs", self._interval)
            if not more:
                self._wake.wait(self._interval)
