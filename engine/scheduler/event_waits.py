"""The event-wait duty: stored events matched to open waits (`Step.wait_for`) that neither side
matched itself, waits past their timeout ended by their `on_timeout`, and unmatched events past
their retention deleted (store.inbound.match), and approvals past their `escalate_after` given
their one `approval_overdue` alert (store.inbound.approvals).

Most matches happen without it: an event stored while its wait is open completes it at once
(store.inbound.ingest), and a wait that opens takes its stored event at once
(store.inbound.consume). What is left is an event that raced its wait's opening (neither
transaction saw the other's row) or found the wait's run held by another transaction: this
duty's pass matches those. It runs when the earliest open wait times out and at least every
`rescan_interval`, not at every wake-up: a pass reads the unmatched events joined to the open
waits, whose cost grows with the unmatched events kept (bench/event_waits.py).
"""

from __future__ import annotations

import time

from sasflow.scheduler.cluster.member import ClusterMember
from sasflow.scheduler.context import Context, Part
from sasflow.scheduler.duty import INF, Duty
from sasflow.scheduler.outbox import RelayDuty
from sasflow.store.db import transaction
from sasflow.store.inbound import approvals, match

EVENT_BATCH = 200
"""Matches (and timeouts) in one transaction; a full batch runs the next at once."""
SHORTEST_WAIT = 0.02
"""Seconds between two passes while a match or a timeout waits for a run another transaction
holds."""


class EventWaitDuty(Part, Duty):
    """See the module docstring."""

    def __init__(
        self,
        ctx: Context,
        member: ClusterMember,
        *,
        outbox: RelayDuty,
        rescan_interval: float,
        batch: int = EVENT_BATCH,
    ) -> None:
        super().__init__(ctx)
        self._member = member
        self._outbox = outbox
        self._rescan_interval = rescan_interval
        self._batch = batch

    def run(self, t: float) -> float:
        if not self._member.may_act or t < self.due:
            return INF
        batch, namespace, actor = self._batch, self._names.namespace, self._id
        with transaction(self._engine) as conn:
            matched = match.match(
                conn, self._registry, batch=batch, namespace=namespace, actor=actor
            )
            timed_out = match.time_out(
                conn, self._registry, batch=batch, namespace=namespace, actor=actor
            )
            match.expire(conn, batch=self._batch)
            approvals.escalate(conn, batch=batch, actor=actor)
            for report in (matched, timed_out):
                self._hooks.runs_finished(conn, report.finished)
            due = (match.seconds_until_next_timeout(conn), approvals.next_escalation(conn))
            following = min((d for d in due if d is not None), default=None)
        if matched.completed or timed_out.completed:
            self._outbox.recorded()
        if matched.ready or timed_out.ready:
            self._wake.set()
        if matched.deferred or timed_out.deferred:
            self._advance.set()
        if matched.full or timed_out.full:
            self.due = 0.0
            return 0.0
        wait = self._rescan_interval
        if following is not None:
            wait = min(wait, max(following, SHORTEST_WAIT))
        self.due = time.monotonic() + wait
        return INF
