"""Redelivered `exclusive` requests (a step under a concurrency limit, docs/flow-control.md):
an attempt that may have run already must not run again past the database's deadline for it.

An exclusive request is acknowledged when a worker takes it (sasflow.agents.acks), so the
broker should never deliver it twice. It still can: an acknowledgement is not confirmed, and
one written just before the connection drops, or one the broker had not made durable when it
crashed, is lost; the broker then redelivers the request, to this process after it reconnects
or to another. By then the first execution may have run (and finished), the database may have
counted the attempt's deadline (the `started` it received set it to the start plus the
budget), and the concurrency limit may have admitted the next step of the same key. A copy
run with a fresh budget from its own receipt then acts beside that step: the chaos suite's
per-account check saw it (a charge redelivered after a broker restart ran 10 s after its
attempt's start, beside the account's next charge).

So a redelivered exclusive request runs, if at all, only within the budget counted from its
claim: no execution of the attempt, wherever it started, could have started earlier, so none
of this copy outlives the database's deadline for the attempt (at most the claim plus the
wait plus the budget, at least the start plus the budget). And a process never runs again an
exclusive attempt it took already (`Redeliveries.taken`), whatever the clocks say.

The claim's time is on the database clock (the request's `complete_by` minus its wait and
budget); this process relates it to its own clock through the fresh (not redelivered)
requests it receives: their receipt minus their claim is the clocks' offset plus a transit
time, so the smallest over the last minutes bounds the offset from above by the shortest
transit (milliseconds). Clock skew between the agent and the database cancels out. A process
that has received no fresh request yet assumes the clocks agree.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from datetime import datetime

from sasflow.messages import Request

OFFSET_WINDOW = 600.0
"""Seconds over which the smallest receipt-minus-claim of fresh requests is kept."""
TAKEN_KEPT = 600.0
"""Seconds past its deadline an exclusive attempt taken here is remembered."""
TAKEN_MAX = 10_000
"""Exclusive attempts remembered at most (the oldest are forgotten first)."""


def claimed_at(request: Request) -> float | None:
    """The request's claim on the database clock (epoch seconds), or None for an older
    scheduler's request (no wait clock) or an unreadable `complete_by`."""
    if request.wait_ms is None:
        return None
    try:
        envelope_end = datetime.fromisoformat(request.complete_by).timestamp()
    except ValueError:
        return None
    return envelope_end - (request.wait_ms + request.budget_ms) / 1000


class Redeliveries:
    """What one agent process knows to judge redelivered exclusive requests: `received` and
    `latest_end` on the owner thread, `took` on worker threads, `taken` on the owner thread
    (the taken attempts under a lock)."""

    def __init__(
        self, *, window: float = OFFSET_WINDOW, kept: float = TAKEN_KEPT, most: int = TAKEN_MAX
    ) -> None:
        self._window = window
        self._kept = kept
        self._most = most
        self._offsets: deque[tuple[float, float]] = deque()
        """(monotonic receipt, receipt wall time minus claim), smallest last (a monotonic
        deque: a sample larger than a later one can never be the minimum again)."""
        self._taken: OrderedDict[tuple[int, int], float] = OrderedDict()
        self._lock = threading.Lock()

    def received(self, request: Request, redelivered: bool, *, mono: float, wall: float) -> None:
        """Learn the clocks' offset from a fresh request received at `wall` (`mono`)."""
        claim = claimed_at(request)
        if redelivered or claim is None:
            return
        sample = wall - claim
        while self._offsets and self._offsets[-1][1] >= sample:
            self._offsets.pop()
        self._offsets.append((mono, sample))

    def offset(self, mono: float) -> float | None:
        """The smallest receipt-minus-claim of the fresh requests of the last window."""
        while self._offsets and self._offsets[0][0] < mono - self._window:
            self._offsets.popleft()
        return self._offsets[0][1] if self._offsets else None

    def latest_end(self, request: Request, *, mono: float, wall: float) -> float | None:
        """For a redelivered exclusive request received at `wall` (`mono`): when (monotonic)
        its attempt must end here at the latest, its claim plus its budget; None when the
        request has no claim time (an older scheduler's)."""
        claim = claimed_at(request)
        if claim is None:
            return None
        offset = self.offset(mono)
        claim_here = claim + (0.0 if offset is None else offset)
        return mono + (claim_here + request.budget_ms / 1000 - wall)

    def took(self, request: Request, deadline: float) -> None:
        """A worker took exclusive `request`, to run it until `deadline` (monotonic)."""
        key = (request.step_id, request.attempt)
        now = time.monotonic()
        with self._lock:
            self._taken[key] = deadline + self._kept
            self._taken.move_to_end(key)
            while self._taken and (len(self._taken) > self._most or _first(self._taken) < now):
                self._taken.popitem(last=False)

    def taken(self, request: Request) -> bool:
        """Whether this process took that exclusive attempt already (not long ago)."""
        with self._lock:
            until = self._taken.get((request.step_id, request.attempt))
        return until is not None and until >= time.monotonic()


def _first(taken: OrderedDict[tuple[int, int], float]) -> float:
    return next(iter(taken.values()))
