"""Deliver raised alerts to the sinks: the `alerts` table is the outbox, `notified_at` its mark.

How it behaves, and the decisions behind it:

- **Notified only where a sink took it.** Each alert records the sinks that took it
  (`delivered_to`). A dispatch sends an alert only to the sinks that have not, and once every
  sink has, marks it notified (`notified_at = now()`, in the transaction that selected it).
  A crash before that commit sends it again to those sinks on the next dispatch: at least
  once per sink.
- **A failing sink is retried, and blocks nobody.** A sink that raises (a webhook that
  exhausted its own retries, an SMTP relay that refused, the broker of the `<ns>.alerts`
  exchange down) is logged at ERROR with the alert id; the alert keeps the error per sink
  (`delivery_errors`) and is taken again for the failed sinks only after a backoff
  (`retry_at`: 5 s doubling to 15 min), so later alerts go out meanwhile. A sink still failing
  a day after the alert was raised is given up for it: the alert is marked notified with the
  errors kept, and `sasflow alerts show` says which sinks never took it.
- **A slow sink blocks nobody.** Each sink has its own worker thread and takes alerts in
  order; sinks work in parallel. `dispatch_pending(budget_s)` returns when every attempt of
  the batch finished or the budget is used, whichever comes first. Attempts still queued or
  running then carry on; their alerts stay unmarked (and locked rows are released), and the
  next dispatch waits for those same attempts instead of starting new ones, so a sink slower
  than the budget neither loses alerts nor receives them twice from this process. (A second
  supervisor process may send them again: at least once.)
- **Incidents.** Alerts counted into an open incident after its first are marked notified
  when raised (store/outbox/incidents.py); with `remind_every`, each batch first queues an
  `incident_ongoing` notice for the open incidents that counted alerts since they were last
  told, at most every `remind_every` seconds each. Notices are rows of the same outbox.
- **Never in the caller's way.** `start()` runs dispatching in a daemon thread that waits on
  an event (`wake()`, or every `interval` seconds); the supervisor's sweep only calls `wake()`.
  A database outage inside the thread is logged and retried at the next interval (a schema
  not at head is said once, through the role's `SchemaWatch`); nothing ends the thread but
  `stop()`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, wait

from sasflow.errors import SchemaOutdatedError, StoreUnavailableError
from sasflow.hooks import Hooks, guarded
from sasflow.schema_watch import SchemaWatch
from sasflow.store.db import Engine, transaction
from sasflow.store.outbox.alerts import Delivery, record_deliveries, take_unnotified
from sasflow.store.outbox.incidents import queue_reminders
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
        schema: SchemaWatch | None = None,
        remind_every: float = 0.0,
    ) -> None:
        self._hooks = guarded(hooks)
        self._remind_every = remind_every
        """Seconds between "still happening" notices of an open incident (0: none)."""
        self._engine = engine
        self.schema = schema or SchemaWatch(engine, "alerts")
        """Shared with the supervisor's sweep: the role says a missing schema once."""
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
            if self._remind_every > 0:
                queue_reminders(conn, self._remind_every)
            rows = take_unnotified(conn, limit=BATCH)
            records = {r.id: AlertRecord.from_row(r, self._namespace) for r in rows}
            self._forget_except(set(records), complete=len(rows) < BATCH)
            taken = {r.id: list(r.delivered_to or []) for r in rows}
            attempts = {
                alert_id: {
                    index: self._attempt(record, index)
                    for index, worker in enumerate(self._workers)
                    if worker.sink.name not in taken[alert_id]
                }
                for alert_id, record in records.items()
            }
            self._wait(
                [f for fs in attempts.values() for f in fs.values()],
                deadline,
                interruptible=interruptible,
            )
            finished = [
                self._outcome(alert_id, taken[alert_id], fs)
                for alert_id, fs in attempts.items()
                if all(f.done() for f in fs.values())
            ]
            marked = record_deliveries(conn, finished) if finished else []
            first_time = {r.id for r in rows if not r.delivery_attempts}
            for delivery in finished:
                if delivery.alert_id in first_time:
                    self._hooks.alert_raised(records[delivery.alert_id].kind)
        for delivery in finished:
            for index in range(len(self._workers)):
                self._attempts.pop((delivery.alert_id, index), None)
        return len(marked), len(rows) == BATCH and len(finished) == len(rows)

    def _outcome(
        self, alert_id: int, taken: list[str], attempts: dict[int, Future[None]]
    ) -> Delivery:
        delivered = list(taken)
        errors: dict[str, str] = {}
        for index, future in attempts.items():
            name = self._workers[index].sink.name
            exc = None if future.cancelled() else future.exception()
            if future.cancelled() or exc is not None:
                errors[name] = "cancelled" if exc is None else f"{type(exc).__name__}: {exc}"
            elif name not in delivered:
                delivered.append(name)
        return Delivery(alert_id, delivered, errors)

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
                self.schema.ok()
            except SchemaOutdatedError as exc:
                self.schema.failed(exc)
            except StoreUnavailableError as exc:
                log.warning("alerts not dispatched: %s; retrying in %.1fs", exc, self._interval)
            except Exception:
                log.exception("alert dispatch failed; retrying in %.1fs", self._interval)
            if not more:
                self._wake.wait(self._interval)
