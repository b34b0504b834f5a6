"""Backpressure at the doors: how many runs of a workflow may wait to start, and what a door
does past that bound (docs/backpressure.md).

A workflow's backlog is its runs submitted but not started yet (`runs.state = 'pending'`; a run
starts when a scheduler claims its first step), of every version. The bound is the
`max_backlog` of the workflow's latest registered version, else the process's setting
(SASFLOW_MAX_BACKLOG); 0 is no bound. This module is the doors'
shared vocabulary, without I/O: the bound, what one read of the backlog says (`Room`), and how
the submitter splits a batch under it (`split_batch`). The reads are `sasflow.doors`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from sasflow.errors import BacklogFullError
from sasflow.workflow import Workflow

DEFAULT_MAX_BACKLOG = 10_000
"""Runs of one workflow that may wait to start, by default. Ten seconds of the engine's
throughput on a small machine (docs/performance.md), far more than a healthy deployment ever
has waiting, and cheap to count: a door counts at most this many index entries, once a second."""
RETRY_AFTER_S = 5
"""What a refusal tells the submitter to wait, in seconds (HTTP `Retry-After`): fixed, because
the backlog is counted and the start rate is not (docs/backpressure.md)."""
READ_EVERY_S = 1.0
"""Seconds a door (the HTTP API, the submitter) reuses one read of a workflow's backlog."""
HOLD_S = 60.0
"""Seconds the submitter holds one delivery unacked past the bound before it hands it back to
`<ns>.submit` (and takes it again): no delivery waits unacked for long, so the broker's
consumer timeout (30 min by default) never closes the channel over a held submission."""

OnBacklog = Literal["accept", "reject"]
"""What `submit_run` does past the bound: record the run anyway, or raise BacklogFullError."""
SubmitterPolicy = Literal["hold", "reject", "accept"]
"""What the submitter does past the bound: leave the submissions in `<ns>.submit` until there
is room (hold), dead-letter them with the reason (reject), or record them anyway (accept)."""
ON_BACKLOG: tuple[OnBacklog, ...] = ("accept", "reject")
SUBMITTER_POLICIES: tuple[SubmitterPolicy, ...] = ("hold", "reject", "accept")


@dataclass(frozen=True)
class SubmitterBackpressure:
    """The submitter's door: its bound and what it does past it."""

    max_backlog: int = DEFAULT_MAX_BACKLOG
    """The bound of a workflow that sets none (0: no bound)."""
    policy: SubmitterPolicy = "hold"
    hold_s: float = HOLD_S

    def __post_init__(self) -> None:
        if self.max_backlog < 0:
            raise ValueError(f"max_backlog must be >= 0, got {self.max_backlog}")
        if self.policy not in SUBMITTER_POLICIES:
            raise ValueError(f"policy must be one of {SUBMITTER_POLICIES}, got {self.policy!r}")
        if not self.hold_s > 0:
            raise ValueError(f"hold_s must be > 0, got {self.hold_s}")


def bound_of(workflow: Workflow, default: int) -> int | None:
    """The bound of `workflow`'s backlog: its own `max_backlog`, else `default`; None when that
    is 0 (no bound)."""
    chosen = default if workflow.max_backlog is None else workflow.max_backlog
    return chosen or None


@dataclass(frozen=True)
class Room:
    """What a door knows of one workflow's backlog."""

    workflow: str
    backlog: int
    """Runs waiting to start, counted up to the bound (0 and not counted when unbounded)."""
    bound: int | None

    @property
    def free(self) -> int | None:
        """Runs that may still be admitted (None: no bound)."""
        if self.bound is None:
            return None
        return max(0, self.bound - self.backlog)

    @property
    def full(self) -> bool:
        return self.bound is not None and self.backlog >= self.bound

    def admitting(self, count: int) -> Room:
        """This room after `count` more runs were admitted (a door's own admissions, counted
        until its next read)."""
        return Room(self.workflow, self.backlog + count, self.bound)

    def refusal(self) -> BacklogFullError:
        if self.bound is None:
            raise ValueError(f"workflow {self.workflow!r} has no bound: nothing to refuse")
        return BacklogFullError(
            self.workflow, backlog=self.backlog, bound=self.bound, retry_after=RETRY_AFTER_S
        )


T = TypeVar("T")


@dataclass(frozen=True)
class Split(Generic[T]):
    """A batch of one workflow's submissions under its bound."""

    admitted: list[T]
    """Recorded now, in arrival order."""
    over: list[T]
    """Past the bound: held, dead-lettered or recorded anyway, as the door's policy says."""


def split_batch(room: Room, items: Sequence[T]) -> Split[T]:
    """Admit the first `room.free` of `items` (all of them when unbounded), in order: a batch
    never takes a workflow past its bound, and what arrived first is admitted first."""
    free = room.free
    if free is None:
        return Split(list(items), [])
    return Split(list(items[:free]), list(items[free:]))
