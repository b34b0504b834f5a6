"""The submitter role: turn messages on `<ns>.submit` into runs, idempotently.

A batch of deliveries is recorded in one transaction (store.submit.record_runs: on
PostgreSQL its runs take one statement) and acked after the commit. When the database refuses
the data of one submission, the batch is recorded again with each submission in its own
savepoint, so the bad one is dead-lettered with its reason without undoing the others.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from sasflow.commands import NewRun, Refused, SubmitResult
from sasflow.errors import InvalidInputError, InvalidMessageError
from sasflow.hooks import Hooks, guarded
from sasflow.messages import DEFAULT_LIMITS, Limits, Submission, parse
from sasflow.registry import Registry
from sasflow.relay import relay_events
from sasflow.runtime import Reconnect, process_id, serve_forever
from sasflow.store.db import Engine, transaction
from sasflow.store.runs.submit import record_runs
from sasflow.transport.base import Delivery, Transport
from sasflow.transport.topology import Names, declare_common

log = logging.getLogger(__name__)

DEFAULT_PREFETCH = 200
"""Submissions held, and inserted in one transaction, at once."""


@dataclass
class SubmitterStats:
    created: int = 0
    duplicates: int = 0
    dead_lettered: int = 0


class Submitter:
    """Consumes submissions until `stop` is set."""

    def __init__(
        self,
        engine: Engine,
        transport: Transport,
        registry: Registry,
        names: Names,
        *,
        prefetch: int = DEFAULT_PREFETCH,
        limits: Limits = DEFAULT_LIMITS,
        stop: threading.Event | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.id = process_id("submitter")
        self._hooks = guarded(hooks)
        self._engine = engine
        self._transport = transport
        self._registry = registry
        self._names = names
        self._prefetch = prefetch
        self._limits = limits
        self._stop = stop or threading.Event()
        self._held: list[Delivery] = []
        self.stats = SubmitterStats()

    @property
    def stop_event(self) -> threading.Event:
        return self._stop

    def run(self) -> None:
        try:
            serve_forever(
                self.id, self._serve, self._stop, Reconnect(), self._hooks.consumer_cancelled
            )
        finally:
            self._transport.close()
        log.info("%s stopped: %s", self.id, self.stats)

    def _serve(self) -> None:
        self._held.clear()
        self._transport.connect()
        declare_common(self._transport, self._names)
        self._transport.consume(self._names.submit, self._on_delivery, prefetch=self._prefetch)
        log.info("%s consuming %s", self.id, self._names.submit)
        while not self._stop.is_set():
            self._transport.process(0.0 if self._held else 0.5)
            if self._held:
                self._insert_held()
        self._transport.cancel_consumers()
        self._transport.process(0)
        if self._held:
            self._insert_held()

    def _on_delivery(self, delivery: Delivery) -> None:
        self._held.append(delivery)

    def _insert_held(self) -> None:
        held, self._held = self._held, []
        created, duplicates = self.stats.created, self.stats.duplicates
        rejected: list[tuple[Delivery, str]] = []
        parsed: list[tuple[Delivery, NewRun]] = []
        for delivery in held:
            try:
                parsed.append((delivery, self._new_run(delivery)))
            except InvalidMessageError as exc:
                rejected.append((delivery, str(exc)))
        news = [new for _, new in parsed]
        try:
            try:
                answers = self._record(news, isolate=False)
            except InvalidInputError as exc:
                log.info(
                    "%s: batch refused (%s): recording it one submission at a time", self.id, exc
                )
                answers = self._record(news, isolate=True)
        except Exception:
            self._held = held + self._held  # nothing committed: keep them unacked, retry
            raise
        for (delivery, new), answer in zip(parsed, answers, strict=True):
            if isinstance(answer, Refused):
                rejected.append((delivery, answer.reason))
            elif answer.created:
                self.stats.created += 1
            else:
                self.stats.duplicates += 1
                log.info(
                    "duplicate submission %s/%s -> run %s",
                    new.workflow,
                    answer.business_key,
                    answer.run_id,
                )
        for delivery, reason in rejected:
            self._transport.dead_letter(
                delivery, reason, dead_letter_exchange=self._names.dead_letter_exchange
            )
            self.stats.dead_lettered += 1
            self._hooks.dead_lettered(delivery.queue, reason)
        self._hooks.runs_submitted(self.stats.created - created, self.stats.duplicates - duplicates)
        rejected_tags = {d.tag for d, _ in rejected}
        for delivery in held:
            if delivery.tag not in rejected_tags:
                self._transport.ack(delivery)
        relay_events(self._engine, self._transport, self._names, hooks=self._hooks)

    def _new_run(self, delivery: Delivery) -> NewRun:
        """The run a delivery asks for (InvalidMessageError when it is not a submission)."""
        submission = parse(Submission, delivery.body, self._limits)
        if submission.key is None and delivery.message_id:
            # Keyless: the AMQP message id keeps a redelivery idempotent.
            submission = submission.model_copy(update={"key": f"msg:{delivery.message_id}"[:200]})
        return submission.new_run(self._hooks.submission_received(delivery))

    def _record(self, news: list[NewRun], *, isolate: bool) -> list[SubmitResult | Refused]:
        """Record the batch in one transaction (see store.submit.record_runs)."""
        with transaction(self._engine) as conn:
            return record_runs(
                conn,
                self._registry,
                news,
                namespace=self._names.namespace,
                actor=self.id,
                isolate=isolate,
            )
