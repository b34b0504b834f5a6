"""The submitter role: turn messages on `<ns>.submit` into runs, idempotently.

A batch of deliveries is recorded in one transaction (store.submit.record_runs: on
PostgreSQL its runs take one statement) and acked after the commit. When the database refuses
the data of one submission, the batch is recorded again with each submission in its own
savepoint, so the bad one is dead-lettered with its reason without undoing the others.

Backpressure (docs/backpressure.md): a submission whose workflow has as many runs waiting to
start as its bound is, by the door's policy, held (left unacked, so it stays in `<ns>.submit`,
and taken again once there is room; a full prefetch window of held submissions stops the
queue), dead-lettered with the reason (reject), or recorded anyway (accept). A submission
whose key names an existing run is always answered (acked as a duplicate).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from sasflow.backpressure import (
    READ_EVERY_S,
    Room,
    SubmitterBackpressure,
    bound_of,
    split_batch,
)
from sasflow.commands import NewRun, Refused, SubmitResult
from sasflow.doors import BacklogGate, known_keys
from sasflow.errors import (
    InvalidInputError,
    InvalidMessageError,
    SchemaOutdatedError,
    UnknownWorkflowError,
)
from sasflow.event_ingress import EventIngress
from sasflow.hooks import Hooks, guarded
from sasflow.messages import DEFAULT_LIMITS, Limits, Submission, parse
from sasflow.registry import Registry
from sasflow.relay import HeldBack, relay_pass
from sasflow.runtime import Reconnect, process_id, serve_forever
from sasflow.schema_watch import SchemaWatch
from sasflow.store.db import Engine, transaction
from sasflow.store.runs.submit import record_runs
from sasflow.transport.base import Delivery, Transport
from sasflow.transport.topology import Names, declare_common
from sasflow.workflow import Workflow

log = logging.getLogger(__name__)

Entry = tuple[Delivery, NewRun]
Rejected = tuple[Delivery, str]
"""A delivery to dead-letter, and why."""

DEFAULT_PREFETCH = 200
"""Submissions held, and inserted in one transaction, at once."""


@dataclass
class SubmitterStats:
    created: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    held: int = 0
    """Deliveries held past their workflow's bound (each time one was held anew)."""


@dataclass
class _Waiting:
    """Deliveries held past the bound, oldest first, and since when each (monotonic)."""

    entries: list[Entry] = field(default_factory=list)
    since: dict[int, float] = field(default_factory=dict)
    looked_at: float = 0.0
    """When they were last tried (monotonic)."""

    def clear(self) -> None:
        self.entries.clear()
        self.since.clear()


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
        backpressure: SubmitterBackpressure | None = None,
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
        self._backpressure = backpressure or SubmitterBackpressure()
        self._gate = BacklogGate(self._backpressure.max_backlog)
        self._waiting = _Waiting()
        self._held_back = HeldBack(1.0)
        self._relay_again = 0.0
        """When to relay again after a pass that held events back (0.0: not due)."""
        self.stats = SubmitterStats()
        self.schema = SchemaWatch(engine, self.id)
        self.events = EventIngress(engine, transport, registry, names, actor=self.id, limits=limits)

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
        self.events.held.clear()
        self._waiting.clear()  # unacked on the old connection: the broker has them back
        self._transport.connect()
        declare_common(self._transport, self._names)
        self._transport.consume(self._names.submit, self._on_delivery, prefetch=self._prefetch)
        self.events.consume(self._prefetch)
        log.info("%s consuming %s and %s", self.id, self._names.submit, self._names.events)
        retry, retry_at = Reconnect(), 0.0  # retry_at: while the schema is not at head
        while not self._stop.is_set():
            wait = 0.0 if self._held or self.events.held else 0.5
            if retry_at:
                wait = min(0.5, max(0.0, retry_at - time.monotonic()))
            if self._relay_again:
                wait = min(wait, max(0.0, self._relay_again - time.monotonic()))
            self._transport.process(wait)
            self.events.drain()
            if self._relay_again and time.monotonic() >= self._relay_again:
                self._relay()
            if (self._held or self._waiting_due()) and time.monotonic() >= retry_at:
                try:
                    self._insert_held()
                except SchemaOutdatedError as exc:
                    # Held unacked, tried again quietly: said once (sasflow.schema_watch).
                    self.schema.failed(exc)
                    retry_at = time.monotonic() + retry.next_delay()
                else:
                    retry_at = 0.0
                    retry.reset()
                    self.schema.ok()
        self._transport.cancel_consumers()
        self._transport.process(0)
        if self._held:
            self._insert_held()
        self.events.drain()

    def _on_delivery(self, delivery: Delivery) -> None:
        self._held.append(delivery)

    def _waiting_due(self) -> bool:
        """Whether the held submissions should be tried again now (a new read of their
        workflows' backlogs is due)."""
        return bool(self._waiting.entries) and (
            time.monotonic() - self._waiting.looked_at >= READ_EVERY_S
        )

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
        # The held ones first: what arrived first is admitted first.
        waiting, self._waiting.entries = self._waiting.entries, []
        self._waiting.looked_at = time.monotonic()
        try:
            parsed, over, rooms = self._admit(waiting + parsed)
        except Exception:
            # Nothing read: all of them as they were, to be tried again.
            self._held, self._waiting.entries = held + self._held, waiting
            raise
        rejected += self._past_the_bound(over, rooms)
        news = [new for _, new in parsed]
        try:
            try:
                answers = self._record(news, isolate=False) if news else []
            except InvalidInputError as exc:
                log.info(
                    "%s: batch refused (%s): recording it one submission at a time", self.id, exc
                )
                answers = self._record(news, isolate=True)
        except Exception:
            # Nothing committed: keep them unacked and try again (the held ones, held).
            self._held = [d for d, _ in parsed] + [d for d, _ in rejected] + self._held
            raise
        self._settle(parsed, answers, rejected)
        self._hooks.runs_submitted(self.stats.created - created, self.stats.duplicates - duplicates)
        self._relay()

    def _relay(self) -> None:
        """Relay the events waiting (after each batch); again soon after a pass that held
        back events of runs whose earlier event another relay held (sasflow.relay)."""
        held_back = relay_pass(self._engine, self._transport, self._names, hooks=self._hooks)[1]
        self._relay_again = time.monotonic() + self._held_back.delay if held_back else 0.0
        self._held_back.passed(held_back=held_back)

    def _settle(
        self,
        parsed: list[tuple[Delivery, NewRun]],
        answers: list[SubmitResult | Refused],
        rejected: list[tuple[Delivery, str]],
    ) -> None:
        """After the commit: count, dead-letter what was refused, ack the rest."""
        for (delivery, new), answer in zip(parsed, answers, strict=True):
            if isinstance(answer, Refused):
                rejected.append((delivery, answer.reason))
            elif answer.created:
                self.stats.created += 1
                self._gate.admitted(new.workflow, 1)
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
        rejected_tags = {d.tag for d, _ in rejected}
        for delivery, _ in parsed:
            if delivery.tag not in rejected_tags:
                self._transport.ack(delivery)
            self._waiting.since.pop(delivery.tag, None)

    def _admit(self, entries: list[Entry]) -> tuple[list[Entry], list[Entry], dict[str, Room]]:
        """(the entries to record now, those past their workflow's bound, each in order, and
        the room of each workflow once the admitted ones are recorded). A workflow without a
        bound, or unknown (record_runs refuses it), is not read."""
        if self._backpressure.policy == "accept" or not entries:
            return entries, [], {}
        bounded: dict[str, Workflow] = {}
        for _, new in entries:
            if new.workflow in bounded:
                continue
            try:
                workflow = self._registry.workflow(new.workflow)
            except UnknownWorkflowError:
                continue
            if bound_of(workflow, self._backpressure.max_backlog) is not None:
                bounded[new.workflow] = workflow
        if not bounded:
            return entries, [], {}
        if self._room_known_for_all(bounded, entries):
            return entries, [], {}  # no read due and room for every one: no transaction
        over_tags: set[int] = set()
        rooms: dict[str, Room] = {}
        with transaction(self._engine) as conn:
            for name, workflow in bounded.items():
                mine = [e for e in entries if e[1].workflow == name]
                room = self._gate.room(conn, workflow)
                split = split_batch(room, mine)
                rooms[name] = room.admitting(len(split.admitted))
                if split.over:
                    # A key that names a run is answered (a duplicate), never held.
                    keys = [n.key for _, n in split.over if n.key]
                    known = known_keys(conn, name, keys)
                    over_tags |= {d.tag for d, n in split.over if n.key not in known}
        admitted = [e for e in entries if e[0].tag not in over_tags]
        return admitted, [e for e in entries if e[0].tag in over_tags], rooms

    def _room_known_for_all(self, bounded: dict[str, Workflow], entries: list[Entry]) -> bool:
        """Whether every bounded workflow's last read (still fresh) leaves room for all of its
        entries."""
        for name, workflow in bounded.items():
            room = self._gate.fresh(workflow)
            wanted = sum(1 for _, new in entries if new.workflow == name)
            if room is None or (room.free is not None and room.free < wanted):
                return False
        return True

    def _past_the_bound(self, over: list[Entry], rooms: dict[str, Room]) -> list[Rejected]:
        """Apply the policy to submissions past their bound: hold them (and hand back to the
        queue those held HOLD_S), or return them to dead-letter with the reason."""
        if not over:
            return []
        counts: dict[str, int] = {}
        rejected: list[Rejected] = []
        now = time.monotonic()
        for delivery, new in over:
            if self._backpressure.policy == "reject":
                reason = f"backlog full: {rooms[new.workflow].refusal()}"
                rejected.append((delivery, reason))
                counts[new.workflow] = counts.get(new.workflow, 0) + 1
                continue
            since = self._waiting.since.get(delivery.tag)
            if since is None:
                self._waiting.since[delivery.tag] = now
                self.stats.held += 1
                counts[new.workflow] = counts.get(new.workflow, 0) + 1
            elif now - since >= self._backpressure.hold_s:
                # Never unacked for long (the broker's consumer timeout): back to the queue,
                # which hands it to us again as a new delivery.
                self._waiting.since.pop(delivery.tag, None)
                self._transport.requeue(delivery)
                continue
            self._waiting.entries.append((delivery, new))
        for workflow, count in counts.items():
            self._hooks.submissions_refused(workflow, "submitter", count)
        if counts and self._waiting.entries:
            log.info(
                "%s: holding %d submission(s) in %s past their workflow's bound (%s)",
                self.id,
                len(self._waiting.entries),
                self._names.submit,
                ", ".join(f"{w}: {c} new" for w, c in sorted(counts.items())),
            )
        return rejected

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
