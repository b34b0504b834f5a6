"""When the scheduler relays the events it records (the relaying itself: sasflow.relay.Relay).

Events go out at every `relay_interval`, and sooner when there is reason to: at the next pass
after replies recorded events (or after a full batch: more wait), and within CLAIM_EVENTS_DELAY
of a claim, and within milliseconds of a pass that held events back because another relay
held an earlier event of their run (`Relay.held_back`), again and again with a backoff while
passes keep holding them back (sasflow.relay.HeldBack). Between passes the batches in flight
(published, awaiting the broker's confirms) are marked as their confirms arrive, and the loop
sleeps at most CONFIRM_POLL meanwhile.
"""

from __future__ import annotations

import time

from sasflow.relay import HeldBack, Relay
from sasflow.scheduler.duty import INF, Duty

RELAY_BATCH = 500
"""Events relayed per batch; a full batch means more are waiting."""

CLAIM_EVENTS_DELAY = 0.01
"""Seconds a claim's events may wait for the relay pass after its replies' apply."""

CONFIRM_POLL = 0.005
"""Longest wait of the loop while relayed events await their confirms: a confirm does not
end `process` early, and the batch's rows stay locked until it is marked."""


class RelayDuty(Duty):
    """The scheduler's relay passes (see the module docstring)."""

    def __init__(self, relay: Relay, *, interval: float) -> None:
        self._relay = relay
        self._interval = interval
        self._dirty = True  # the first pass relays whatever waits
        self._claimed = False
        self._held_back = HeldBack(interval)

    def recorded(self) -> None:
        """Replies applied recorded events worth relaying: relay at the next pass."""
        self._dirty = True

    def claimed(self) -> None:
        """A claim recorded events (a run's `pending` one, the `running` of the runs it starts):
        relay them within milliseconds rather than at the next interval, so status
        notifications and the subscription stream see a new run soon, but not at once: the
        replies to these requests are often back by then, and applying them first keeps a
        relay pass off their path (their events then go out together)."""
        self._claimed = True

    def run(self, t: float) -> float:
        if self._claimed:
            self._claimed = False
            self.due = min(self.due, time.monotonic() + CLAIM_EVENTS_DELAY)
        passed = self._dirty or t >= self.due
        if passed:
            self._dirty = self._relay.start() >= RELAY_BATCH
            self.due = t + self._interval
        elif self._relay.in_flight:
            self._relay.poll()
        held_back = self._relay.held_back
        if held_back:
            # Held back by a transaction now ended (this pass's, or a batch's just marked):
            # pass again soon, not at the interval; the backoff moves at passes only.
            self.due = min(self.due, t + self._held_back.delay)
        if passed:
            self._held_back.passed(held_back=held_back)
        # Its confirms arrive during `process`, which does not return for them.
        return CONFIRM_POLL if self._relay.in_flight else INF

    def drain(self) -> None:
        """On stop: relay what waits and wait for every batch's confirms."""
        self._relay.start()
        self._relay.flush()

    def abandon(self) -> None:
        """The broker connection is gone: the batches in flight are relayed again later."""
        self._relay.abandon()
