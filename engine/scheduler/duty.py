"""A duty of the scheduler's loop: something it does when due, on its own clock.

The loop (sasflow.scheduler.loop) applies the replies it holds, reads the clock once, then runs
its duties in a fixed order with that reading `t`. Each `run` does what is due at `t` and
moves `due`, the monotonic time at which it is next due; the loop sleeps until the earliest
`due` of all of them, or less when a duty says so (its return value), and an event (a reply,
a notification) wakes it earlier. A new periodic concern (a limit refresh, a gauge) is a new
duty added to the loop's tuple, not a new timer in the loop.

Rules a duty keeps, because the loop runs in one thread on one broker connection:
- `due` changes only inside its own `run` (and `reset`): the loop reads it right after.
- `run` raises StoreUnavailableError when the database is away; the loop retries the pass.
- No allocation or clock reading beyond what the work itself needs: the loop is hot.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

INF = math.inf
"""A duty's `run` returning it puts no bound on the loop's sleep but its `due`."""


class Duty(ABC):
    """One duty of the loop (see the module docstring)."""

    due: float = 0.0
    """Monotonic time at which it is next due (0.0: at the next pass)."""

    def reset(self) -> None:
        """Due at once: the loop (re)connected."""
        self.due = 0.0

    @abstractmethod
    def run(self, t: float) -> float:
        """Do what is due at `t` (the pass's clock reading). Returns the longest the loop may
        sleep after this pass: 0.0 when more work waits now, INF to leave it to `due`."""


class Periodic(Duty):
    """Calls `action` every `interval` seconds (the fleet's heartbeats, say)."""

    def __init__(self, interval: float, action: Callable[[], object]) -> None:
        self._interval = interval
        self._action = action

    def run(self, t: float) -> float:
        if t >= self.due:
            self._action()
            self.due = t + self._interval
        return INF
