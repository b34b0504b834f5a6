"""A run's timeline as bars: per step and per attempt, how long it was queued (ready, not
claimed), waiting for an agent (claimed, until an agent said it started), executing (from
then until its reply or expiry) and backing off (after a counted failure or a deferral, until
it was ready again), read from the run's events on the database clock. Pure: the run page's
reads hand it the rows; the template draws the bars."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sasflow.states import ReplyStatus, StepState
from sasflow.store.runs.progress import STARTED_REASON

QUEUED = "queued"
WAITING = "waiting"
EXECUTING = "executing"
BACKOFF = "backoff"


@dataclass(frozen=True)
class Segment:
    kind: str
    """QUEUED, WAITING, EXECUTING or BACKOFF."""
    start: datetime
    end: datetime
    ongoing: bool = False
    """Still going when the page was read (its end is the database's `now()`)."""

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())


@dataclass(frozen=True)
class Attempt:
    step: str
    kind: str
    """The step's kind (forward, compensation)."""
    number: int | None
    """The attempt (fencing token); None for a step still queued before its first claim."""
    segments: tuple[Segment, ...]
    outcome: str
    """How it ended (processed, error, failed, expired, wait expired, deferred, cancelled...),
    or `running` / `queued` while it goes on."""
    error: Mapping[str, Any] | None = None

    def seconds(self, kind: str) -> float:
        return sum(s.seconds for s in self.segments if s.kind == kind)


@dataclass(frozen=True)
class Bars:
    attempts: tuple[Attempt, ...]
    start: datetime
    end: datetime

    @property
    def span(self) -> float:
        return max((self.end - self.start).total_seconds(), 1e-3)

    def left(self, segment: Segment) -> float:
        """Where the segment starts, in percent of the run's span."""
        return min(100.0, 100.0 * (segment.start - self.start).total_seconds() / self.span)

    def width(self, segment: Segment) -> float:
        """The segment's length in percent of the span (at least a sliver, so it shows)."""
        return min(100.0 - self.left(segment), max(0.4, 100.0 * segment.seconds / self.span))


def bars(
    run: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    now: datetime,
) -> Bars:
    """The attempts of every step (in the steps' order), from the run's events (oldest first)
    and the database's `now()` for what still goes on."""
    by_step: dict[int, list[Mapping[str, Any]]] = {}
    for event in events:
        if event["entity"] == "step" and event["step_id"] is not None:
            by_step.setdefault(int(event["step_id"]), []).append(event)
    created: datetime = run["created_at"]
    found: list[Attempt] = []
    for step in steps:
        found.extend(_attempts(step, by_step.get(int(step["id"]), []), created, now))
    ends = [s.end for a in found for s in a.segments]
    finished = run.get("finished_at")
    end = max([finished or now, *ends])
    return Bars(tuple(found), created, end)


def _attempts(
    step: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]],
    created: datetime,
    now: datetime,
) -> list[Attempt]:
    name, kind = str(step["name"]), str(step["kind"])
    # A step without dependencies is ready when its run is recorded (no event says so); one
    # with dependencies when an event makes it pending.
    ready: datetime | None = created if not history or _first_is_claim(history) else None
    claim: tuple[int | None, datetime] | None = None
    started: datetime | None = None
    queued: Segment | None = None
    found: list[Attempt] = []
    for event in history:
        at: datetime = event["created_at"]
        before, after = event["from_state"], event["to_state"]
        if after == StepState.PROCESSING and before == StepState.PENDING:
            queued = Segment(QUEUED, ready or at, at)
            claim = (event["attempt"], at)
            started, ready = None, None
        elif before == after == StepState.PROCESSING and event["reason"] == STARTED_REASON:
            started = at
        elif before == StepState.PROCESSING and after != StepState.PROCESSING and claim:
            number, since = claim
            parts = [queued] if queued else []
            parts.extend(_claimed(since, started, at, replied=_replied(event)))
            detail = event["detail"] if isinstance(event["detail"], Mapping) else {}
            retry = _moment(detail.get("not_before"))
            ready = at
            if after == StepState.PENDING and retry is not None and retry > at:
                parts.append(Segment(BACKOFF, at, min(retry, now), ongoing=retry > now))
                ready = retry
            error = detail.get("error")
            outcome = str(event["reason"] or after)
            found.append(Attempt(name, kind, number, tuple(parts), outcome, _error(error)))
            claim, started, queued = None, None, None
        elif after == StepState.PENDING:
            ready = at  # its dependencies are done, or an operator resubmitted it
    if claim is not None:
        number, since = claim
        parts = [queued] if queued else []
        parts.extend(_claimed(since, started, now, replied=False, ongoing=True))
        found.append(Attempt(name, kind, number, tuple(parts), "running"))
    elif step["state"] == StepState.PENDING and ready is not None and ready < now:
        found.append(
            Attempt(name, kind, None, (Segment(QUEUED, ready, now, ongoing=True),), "queued")
        )
    return found


def _claimed(
    claim: datetime,
    started: datetime | None,
    end: datetime,
    *,
    replied: bool,
    ongoing: bool = False,
) -> list[Segment]:
    """From the claim to `end`: waiting for an agent until one said it started, then
    executing. Without a `started` event, an attempt an agent replied to was executing all
    along (an agent that does not say when it starts); one it never replied to (a wait-clock
    expiry, a cancellation) was waiting."""
    if started is not None:
        return [Segment(WAITING, claim, started), Segment(EXECUTING, started, end, ongoing)]
    return [Segment(EXECUTING if replied else WAITING, claim, end, ongoing)]


def _replied(event: Mapping[str, Any]) -> bool:
    """Did an agent's reply end the attempt (not the supervisor, an operator, a release)?"""
    return bool(event["to_state"] == StepState.PROCESSED or event["reason"] in _REPLIES)


_REPLIES = frozenset(status.value for status in ReplyStatus)


def _first_is_claim(history: Sequence[Mapping[str, Any]]) -> bool:
    first = history[0]
    return bool(first["from_state"] == StepState.PENDING)


def _moment(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def _error(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def duration(seconds: float) -> str:
    """A duration as people read it: 40 ms, 1.25 s, 3 min 5 s, 2 h 4 min."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
