"""When the scheduler claims: the cluster membership's step, then the claim it fences.

The membership (sasflow.scheduler.cluster.member) renews the lease, scans and fires schedules;
it runs first in each pass, so no claim is made without a lease. A claim is due when something
woke the scheduler (a notification, an applied reply, a full batch) or at the rescan interval,
sooner when a retry's backoff ends first.
"""

from __future__ import annotations

import threading
import time

from sasflow.scheduler.cluster.member import ClusterMember
from sasflow.scheduler.dispatch import Dispatcher
from sasflow.scheduler.duty import INF, Duty


class ClusterDuty(Duty):
    """The membership's step; due when the step says."""

    def __init__(self, member: ClusterMember) -> None:
        self._member = member

    def run(self, t: float) -> float:
        self.due = t + self._member.step()
        return INF


class ClaimDuty(Duty):
    """Claims and dispatches a batch when woken or at the rescan interval, while the
    membership may act. The plain claim and the budgeted claim (flow limits) keep their own
    times: a rate's next call brings the budgeted claim alone forward, and a full batch of one
    claims again with that one alone, so neither repeats the other's walk of the pending
    steps for nothing."""

    def __init__(
        self,
        member: ClusterMember,
        dispatcher: Dispatcher,
        wake: threading.Event,
        *,
        rescan_interval: float,
        passes_wake_to: threading.Event | None = None,
    ) -> None:
        self._member = member
        self._dispatcher = dispatcher
        self._wake = wake
        self._passes_wake_to = passes_wake_to
        """Set when this duty takes a wake-up (the timer duty's `woken`: it runs after the
        claim and looks for timers among the steps made ready)."""
        self._rescan_interval = rescan_interval
        self._plain_due = 0.0
        self._flow_due = 0.0
        self._again = (False, False)
        """(plain, budgeted): the last batch was full, claim it again at once."""

    def reset(self) -> None:
        super().reset()
        self._plain_due = self._flow_due = 0.0

    def run(self, t: float) -> float:
        if not self._member.may_act:
            return INF
        woken = self._wake.is_set()
        rescan = t >= self._plain_due
        plain = woken or rescan or self._again[0]
        budgeted = woken or rescan or self._again[1] or t >= self._flow_due
        if not (plain or budgeted):
            return INF
        self._wake.clear()
        if woken and self._passes_wake_to is not None:
            self._passes_wake_to.set()
        claimed = self._dispatcher.claim_and_dispatch(plain=plain, budgeted=budgeted)
        now = time.monotonic()
        if plain:
            self._plain_due = t + self._rescan_interval
            if claimed.due is not None:  # a retry's backoff ends before the next rescan
                self._plain_due = min(self._plain_due, now + claimed.due)
        if budgeted:
            self._flow_due = INF if claimed.flow_due is None else now + claimed.flow_due
        self._again = (plain and claimed.full, budgeted and claimed.flow_full)
        self.due = min(self._plain_due, self._flow_due)
        if any(self._again):  # more may be ready: claim again without sleeping
            return 0.0
        return INF
