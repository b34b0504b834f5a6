"""Whether an agent process is wedged: every worker thread held by a handler past its deadline.

A handler that ignores `call.cancelled` keeps its thread after the agent abandoned its step at
the deadline. Once a thread has been held that way for `grace` seconds it counts as held; when
all of them are, the process is **wedged**: it would take requests it cannot start. The worker
then stops consuming its queue and hands back the requests no thread started (they go to other
processes), says `held` in its heartbeats (`agents list`, the console, the `agent_wedged`
alert), and resumes consuming as soon as a thread is free again. Wedged for `exit_after`
seconds, it stops and the `sasflow agent` command exits with WEDGED_EXIT_CODE for its service
manager to restart it (docs/agents.md, "Wedged agents").

Owner thread only: the worker tells it which abandoned jobs a thread still runs and which ones
returned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

from sasflow.agents.jobs import Job

DEFAULT_WEDGE_GRACE = 5.0
"""Seconds a handler may run on past its deadline before its thread counts as held."""
DEFAULT_WEDGED_EXIT = 300.0
"""Seconds a process stays wedged before it exits (0: never)."""
WEDGED_EXIT_CODE = 75
"""Exit status of `sasflow agent` after it was wedged too long (EX_TEMPFAIL: restart me)."""


class Change(Enum):
    NONE = "none"
    WEDGED = "wedged"
    FREED = "freed"
    EXIT = "exit"


@dataclass(frozen=True)
class WedgeOptions:
    grace: float = DEFAULT_WEDGE_GRACE
    """Seconds past its deadline before a handler's thread counts as held."""
    exit_after: float = DEFAULT_WEDGED_EXIT
    """Seconds wedged before the process exits for a restart; 0: never."""


class WedgeWatch:
    """Counts the threads held past deadline and tells when the process becomes wedged, is
    free again, or must exit."""

    def __init__(self, concurrency: int, options: WedgeOptions) -> None:
        self._concurrency = concurrency
        self._options = options
        self._running_late: dict[int, tuple[Job, float]] = {}
        """Abandoned jobs whose handler has not returned: id -> (job, its deadline)."""
        self.wedged_since: float | None = None
        self.held = 0
        """Threads held past deadline + grace, as of the last `check`."""

    @property
    def wedged(self) -> bool:
        return self.wedged_since is not None

    def abandoned(self, job: Job) -> None:
        """The deadline of `job` passed while a thread ran its handler."""
        if job.taken and not job.handed_back:
            self._running_late[id(job)] = (job, job.call.deadline)

    def returned(self, job: Job) -> None:
        """The handler of `job` returned: its thread is free."""
        self._running_late.pop(id(job), None)

    def next_due(self) -> float | None:
        """When `check` may next change its answer (monotonic), or None."""
        if self.wedged_since is not None and self._options.exit_after > 0:
            return self.wedged_since + self._options.exit_after
        later = [
            d + self._options.grace
            for _, d in self._running_late.values()
            if d + self._options.grace > time.monotonic()
        ]
        return min(later, default=None)

    def check(self) -> Change:
        now = time.monotonic()
        self.held = sum(
            1
            for _, deadline in self._running_late.values()
            if now >= deadline + self._options.grace
        )
        if self.held >= self._concurrency:
            if self.wedged_since is None:
                self.wedged_since = now
                return Change.WEDGED
            exit_after = self._options.exit_after
            if exit_after > 0 and now - self.wedged_since >= exit_after:
                return Change.EXIT
            return Change.NONE
        if self.wedged_since is not None:
            self.wedged_since = None
            return Change.FREED
        return Change.NONE
