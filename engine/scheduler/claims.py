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
    membership may act. A budgeted claim (flow limits) may be due sooner, when a rate admits
    its next call: then it alone is claimed, so the plain claim does not walk the pending
    steps again at every call of a rate."""

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
        self._plain_due = 0.0
        self._flow_due = INF

    def reset(self) -> None:
        super().reset()
        self._plain_due = 0.0

    def run(self, t: float) -> float:
        if not self._member.may_act:
            return INF
        woken = self._wake.is_set()
        plain = woken or t >= self._plain_due
        if plain or t >= self._flow_due:
            self._wake.clear()
            full, due, flow_due = self._dispatcher.claim_and_dispatch(plain=plain)
            now = time.monotonic()
            if plain:
                self._plain_due = t + self._rescan_interval
                if due is not None:  # a retry's backoff ends before the next rescan
                    self._plain_due = min(self._plain_due, now + due)
            self._flow_due = INF if flow_due is None else now + flow_due
            self.due = min(self._plain_due, self._flow_due)
            if full:  # more may be ready: claim again at once
                self._wake.set()
                return 0.0
        return INF
