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
    membership may act."""

    def __init__(
        self,
        member: ClusterMember,
        dispatcher: Dispatcher,
        wake: threading.Event,
        *,
        rescan_interval: float,
    ) -> None:
        self._member = member
        self._dispatcher = dispatcher
        self._wake = wake
        self._rescan_interval = rescan_interval

    def run(self, t: float) -> float:
        if self._member.may_act and (self._wake.is_set() or t >= self.due):
            self._wake.clear()
            full, due = self._dispatcher.claim_and_dispatch()
            self.due = t + self._rescan_interval
            if due is not None:  # a retry's backoff ends before the next rescan
                self.due = min(self.due, time.monotonic() + due)
            if full:  # more may be ready: claim again at once
                self._wake.set()
                return 0.0
        return INF
