"""The submitter role: turn messages on `<ns>.submit` into runs, idempotently.

A batch of deliveries is recorded in one transaction and acked after the commit. On
PostgreSQL its runs take one statement (store.submit_many); when the database refuses the data
of that statement, the batch is recorded again with each submission in its own savepoint, so
the bad one is dead-lettered with its reason without undoing the others.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from sasflow.errors import InvalidInputError, InvalidMessageError, UnknownWorkflowError
from sasflow.hooks import Hooks, guarded
from sasflow.messages import DEFAULT_LIMITS, Limits, Submission, parse
from sasflow.registry import Registry
from sasflow.relay import relay_events
from sasflow.runtime import Reconnect, process_id, serve_forever
from sasflow.store import submit_many
from sasflow.store.commands import NewRun, SubmitResult
from sasflow.store.db import Connection, Engine, transaction
from sasflow.store.submit import submit
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
            serve_forever(self.id, self._serve, self._stop, Reconnect())
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
        try:
            try:
                results = self._record_batch(parsed, rejected)
            except _BatchRefusedError as exc:
                log.info(
                    "%s: batch refused (%s): recording it one submission at a time", self.id, exc
                )
                results = self._record_each(parsed, rejected)
        except Exception:
            self._held = held + self._held  # nothing committed: keep them unacked, retry
            raise
        for result in results:
            if result.created:
                self.stats.created += 1
            else:
                self.stats.duplicates += 1
                log.info(
                    "duplicate submission %s/%s -> run %s",
                    result.workflow,
                    result.business_key,
                    result.run_id,
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

    def _record_batch(
        self, parsed: list[tuple[Delivery, NewRun]], rejected: list[tuple[Delivery, str]]
    ) -> list[_Recorded]:
        """Record the batch in one transaction: the runs of one-statement workflows in one
        statement (submit_many), the others one at a time in a savepoint each. Raises
        _BatchRefusedError, having rolled back, when the database refuses the data of the one
        statement: which submission it was is then found by `_record_each`. Appends to
        `rejected` the submissions refused before the database saw them."""
        refused: list[tuple[Delivery, str]] = []
        ready: list[submit_many.Prepared] = []
        generic: list[tuple[Delivery, NewRun]] = []
        results: list[_Recorded] = []
        for delivery, new in parsed:
            try:
                prepared = submit_many.prepare(self._registry, new)
            except (UnknownWorkflowError, InvalidInputError) as exc:
                refused.append((delivery, str(exc)))
                continue
            if submit_many.one_statement(self._engine, prepared.workflow):
                ready.append(prepared)
            else:
                generic.append((delivery, new))
        with transaction(self._engine) as conn:
            if ready:
                try:
                    done = submit_many.insert(
                        conn, ready, actor=self.id, namespace=self._names.namespace
                    )
                except InvalidInputError as exc:
                    raise _BatchRefusedError(str(exc)) from exc
                results.extend(
                    _Recorded.of(p.workflow.name, r) for p, r in zip(ready, done, strict=True)
                )
            results.extend(self._submit_each(conn, generic, refused))
        rejected.extend(refused)
        return results

    def _record_each(
        self, parsed: list[tuple[Delivery, NewRun]], rejected: list[tuple[Delivery, str]]
    ) -> list[_Recorded]:
        """Record the batch in one transaction, each submission in its own savepoint, so that
        a bad one is dead-lettered without undoing the others."""
        with transaction(self._engine) as conn:
            return self._submit_each(conn, parsed, rejected)

    def _submit_each(
        self,
        conn: Connection,
        parsed: list[tuple[Delivery, NewRun]],
        rejected: list[tuple[Delivery, str]],
    ) -> list[_Recorded]:
        results: list[_Recorded] = []
        for delivery, new in parsed:
            try:
                with conn.begin_nested():
                    result = submit(
                        conn, self._registry, new, namespace=self._names.namespace, actor=self.id
                    )
            except (UnknownWorkflowError, InvalidInputError) as exc:
                rejected.append((delivery, str(exc)))
                continue
            results.append(_Recorded.of(new.workflow, result))
        return results


class _BatchRefusedError(Exception):
    """The database refused the data of a batch's one statement."""


@dataclass(frozen=True)
class _Recorded:
    """A recorded submission: its workflow and what the store answered."""

    workflow: str
    run_id: int
    business_key: str
    created: bool

    @classmethod
    def of(cls, workflow: str, result: SubmitResult) -> _Recorded:
        return cls(workflow, result.run_id, result.business_key, result.created)
