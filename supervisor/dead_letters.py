"""The supervisor's retention of dead letters in `<ns>.dead`.

Every dead-lettered message waits in `<ns>.dead` for an operator (`sasflow dead`); nothing
bounded it, so one overload could leave thousands there for good. The queue's own arguments
(`x-max-length`, `x-message-ttl`) would drop them silently inside the broker, and changing them
makes every process's declaration of the existing queue fail (PRECONDITION_FAILED); a broker
policy would drop them as silently. So the supervisor removes them itself, on its retention
pass: the oldest beyond `max_count`, and those dead-lettered more than `keep_s` ago, taken
from the head of the queue (the oldest first; the first one kept is handed back and ends the
pass). Each one removed is in one audit record of the pass (action `dead.expire`: its id,
source queue, reason, age, correlation id and body, cut at BODY_CHARS), in a transaction open
while they are acked and committed after; the pass is also logged, and counted in the sweep's
report (`sasflow_retention_removed_total{what="dead_letters"}`).

The head is looked at again only when it can be past its age (its age is known once seen: the
time is kept in `retention_marks`, on the database clock, so a supervisor run from cron keeps
it too) or when the queue is beyond its bound: a quiet queue's head is not taken and handed
back on every pass (each hand-back counts towards a quorum queue's delivery limit).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sasflow.errors import BrokerUnavailableError
from sasflow.ops.dead import DeadLetter, read_letter
from sasflow.store.cluster.lease import Lease
from sasflow.store.db import Connection, Engine, transaction
from sasflow.store.operator import audit, retention
from sasflow.store.runs.sweeps import SweepReport
from sasflow.transport.base import Delivery, Transport
from sasflow.transport.topology import Names

log = logging.getLogger(__name__)

EXPIRE_ACTION = "dead.expire"
BODY_CHARS = 2000
"""Characters of a removed dead letter's body kept in its audit record."""
PER_PASS = 1000
"""Dead letters removed at most per pass (one audit record)."""


@dataclass
class Taken:
    """What one pass took from the head of the queue."""

    removed: list[tuple[Delivery, DeadLetter, str]]
    """(delivery, letter, why: `age` or `bound`), to be acked."""
    kept: DeadLetter | None = None
    """The first one kept (handed back), if the pass stopped at it."""
    emptied: bool = False


class DeadLetterRetention:
    """Removes from `<ns>.dead` what is older than `keep_s` or beyond `max_count`."""

    def __init__(self, keep_s: float | None, max_count: int | None) -> None:
        self._keep_s = keep_s
        self._max = max_count

    def run(
        self,
        engine: Engine,
        lease: Lease,
        transport: Transport,
        names: Names,
        *,
        actor: str,
        report: SweepReport,
    ) -> None:
        queue = names.dead_letter_queue
        excess = 0
        if self._max is not None:
            excess = max(0, transport.message_count(queue) - self._max)
        if not excess and self._keep_s is None:
            return
        mark = f"dead-letters:{queue}"
        with transaction(engine) as conn:
            lease.check(conn)
            if not excess and not retention.is_due(conn, mark):
                return
            taken = self._take(transport, queue, audit.database_now(conn), excess)
            if self._keep_s is not None:
                retention.mark_due(conn, mark, self._next_look(taken, self._keep_s))
            if not taken.removed:
                return
            done: list[tuple[DeadLetter, str]] = []
            lost: BrokerUnavailableError | None = None
            for delivery, letter, why in taken.removed:
                try:
                    acked = transport.ack(delivery)
                except BrokerUnavailableError as exc:
                    lost = exc  # the rest go back to the queue with the connection
                    break
                if acked:
                    done.append((letter, why))
            failed = len(taken.removed) - len(done)
            _record(
                conn,
                actor=actor,
                queue=queue,
                done=done,
                failed=failed,
                keep_s=self._keep_s,
                max_count=self._max,
            )
        report.dead_letters_expired += len(done)
        if lost is not None:
            raise lost

    @staticmethod
    def _next_look(taken: Taken, keep_s: float) -> float:
        """Seconds until the head can be past its age."""
        if taken.kept is not None:
            age = taken.kept.age_s
            return keep_s - age if age is not None else keep_s  # an ageless head: rarely
        if taken.emptied:
            return keep_s  # what comes next cannot be older sooner
        return 0.0  # the pass stopped at its limit: more at the next

    def _take(self, transport: Transport, queue: str, now: datetime, excess: int) -> Taken:
        taken = Taken([])
        while len(taken.removed) < PER_PASS:
            if self._keep_s is None and len(taken.removed) >= excess:
                break  # only the bound applies: the next one stays untouched
            delivery = transport.get(queue)
            if delivery is None:
                taken.emptied = True
                break
            letter = read_letter(delivery, now)
            if len(taken.removed) < excess:
                taken.removed.append((delivery, letter, "bound"))
            elif self._past_age(letter):
                taken.removed.append((delivery, letter, "age"))
            else:
                transport.requeue(delivery)
                taken.kept = letter
                break
        return taken

    def _past_age(self, letter: DeadLetter) -> bool:
        return self._keep_s is not None and letter.age_s is not None and letter.age_s > self._keep_s


def _record(
    conn: Connection,
    *,
    actor: str,
    queue: str,
    done: list[tuple[DeadLetter, str]],
    failed: int,
    keep_s: float | None,
    max_count: int | None,
) -> None:
    """One audit record of the pass (and one log line), before the commit."""
    letters = []
    for letter, why in done:
        body = letter.body_text()
        letters.append(
            {
                "id": letter.id,
                "why": why,
                "source_queue": letter.source_queue,
                "reason": letter.reason,
                "dead_lettered_at": letter.dead_lettered_at.isoformat()
                if letter.dead_lettered_at
                else None,
                "age_s": letter.age_s,
                "correlation_id": letter.correlation_id,
                "body": body[:BODY_CHARS],
                "body_truncated": len(body) > BODY_CHARS,
            }
        )
    detail = {
        "queue": queue,
        "count": len(done),
        "keep_days": None if keep_s is None else keep_s / 86400,
        "max": max_count,
        "dead_letters": letters,
        "not_acked": failed,
    }
    reason = "retention: dead letters past their age or beyond the queue's bound"
    log.warning(
        "%s by %s: %d dead letter(s) removed from %s (%d past their age, %d beyond %s), "
        "recorded in the audit trail: %s; %d not acked (they stay)",
        EXPIRE_ACTION,
        actor,
        len(done),
        queue,
        sum(1 for _, why in done if why == "age"),
        sum(1 for _, why in done if why == "bound"),
        max_count,
        " ".join(le.id for le, _ in done),
        failed,
    )
    if done:
        audit.record(conn, audit.AuditRecord(actor, EXPIRE_ACTION, reason, detail=detail))
