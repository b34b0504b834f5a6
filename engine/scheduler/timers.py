"""The timer duty: timer steps (`Step.sleep`) that came due become processed, without an agent,
and their runs advance (store.runs.timers).

It is due when the earliest sleeping timer is (read from its index after each pass, on the
database clock), when something woke the scheduler (a step made ready may be a timer: the
claim duty passes its wake-up on, `woken`, and this duty runs after the claim, so a wake-up's
claim does not wait for this transaction) and at least every `rescan_interval`, for timers
another scheduler started. A timer therefore fires within one loop pass of its time when this
scheduler knows of it, and within `rescan_interval` otherwise (docs/concepts.md, "Timer
steps"); the steps it makes ready are claimed at the next pass, at once. Nothing runs per
sleeping timer: one indexed read per pass.
"""

from __future__ import annotations

import threading
import time

from sasflow.scheduler.cluster.member import ClusterMember
from sasflow.scheduler.context import Context, Part
from sasflow.scheduler.duty import INF, Duty
from sasflow.scheduler.outbox import RelayDuty
from sasflow.store.db import transaction
from sasflow.store.runs import timers

TIMER_BATCH = 200
"""Timers fired in one transaction; a full batch fires the next at once."""
SHORTEST_WAIT = 0.02
"""Seconds between two passes while a due timer stays unfired (its run locked by another
transaction): the duty looks again soon without spinning."""


class TimerDuty(Part, Duty):
    """See the module docstring."""

    def __init__(
        self,
        ctx: Context,
        member: ClusterMember,
        *,
        outbox: RelayDuty,
        rescan_interval: float,
        batch: int = TIMER_BATCH,
    ) -> None:
        super().__init__(ctx)
        self._member = member
        self._outbox = outbox
        self._rescan_interval = rescan_interval
        self._batch = batch
        self.woken = threading.Event()
        """Set by the claim duty when it took a wake-up: look for timers at the next pass."""

    def run(self, t: float) -> float:
        if not self._member.may_act or not (t >= self.due or self.woken.is_set()):
            return INF
        with transaction(self._engine) as conn:
            fired = timers.fire_due(
                conn,
                self._registry,
                batch=self._batch,
                namespace=self._names.namespace,
                actor=self._id,
            )
            self._hooks.runs_finished(conn, fired.finished)
            following = None if fired.full else timers.seconds_until_next(conn)
        self.woken.clear()
        if fired.fired:
            self._outbox.recorded()
        if fired.deferred:
            self._advance.set()
        if fired.ready:
            self._wake.set()  # claim the steps made ready at the next pass, without waiting
        if fired.full:
            self.due = 0.0
            return 0.0
        wait = self._rescan_interval
        if following is not None and following < wait:
            wait = max(following, SHORTEST_WAIT)
        self.due = time.monotonic() + wait
        return 0.0 if fired.ready else INF
