"""Sessions at the fake remote service: what the agents executing the limited action (`charge`,
one at a time per account) tell the service, as intervals on the service's one clock.

A handler opens a session when it starts (account, step id, attempt, pid and the budget it has
left, `call.remaining()`) and closes it with its effect call. The service times the session
from its own receipt of the open: it ends at the effect call that closes it, or, if none comes
(the agent was killed, or gave up past its deadline), at begin + the budget announced: the
lease a real service would grant. An effect call that arrives after its session's lease ended
is refused and counted, as a service whose session lease expired refuses it; so no agent acts
for an account outside its interval, and the intervals are exactly where agents may act.

`overlaps()` is the invariant "never two steps of one account executing at once", checked on
those intervals: no two sessions of one account overlap (touching is fine: one closed at the
instant the other began).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

LIMIT_NAME = "chaos-per-account"
"""The flow limit the chaos run defines (`sasflow limits set`)."""
LIMITED_AGENT = "beta"
LIMITED_ACTION = "charge"
LIMIT_KEY = "input.account"
ACCOUNTS = 7
"""Accounts the runs are spread over: few, so that runs of one account contend."""


def account_for(key: str) -> str:
    """The run's account, a function of its business key (which carries the seed)."""
    return f"acct-{zlib.crc32(key.encode()) % ACCOUNTS}"


@dataclass(frozen=True)
class Session:
    """One session, as the service saw it (times on the service's monotonic clock)."""

    id: str
    account: str
    step_id: int
    attempt: int
    pid: int
    budget: float
    """Seconds the agent said it had left when it opened the session."""
    begin: float
    closed_at: float | None = None
    """When the effect call closed it, the agent gave it back, or a reopen of the same
    execution superseded it."""
    refused: bool = False
    """Its effect call came after the lease ended and was refused."""
    wall: float = 0.0
    """`time.time()` at the open, for reports."""

    @property
    def lease_end(self) -> float:
        return self.begin + self.budget

    @property
    def end(self) -> float:
        """Closed: when; never closed (killed, gave up, refused): when its lease ended."""
        return self.closed_at if self.closed_at is not None else self.lease_end

    def execution(self) -> tuple[int, int, int]:
        """One execution of one attempt in one process."""
        return (self.step_id, self.attempt, self.pid)


class RefusedError(Exception):
    """The service refuses the call (HTTP 409): e.g. the session's lease ended."""


@dataclass
class SessionLedger:
    """The service's sessions, under one lock (the server's request threads share it)."""

    sessions: dict[str, Session] = field(default_factory=dict)
    late_effects: int = 0
    """Effect calls refused because their session's lease had ended."""
    clock: Callable[[], float] = time.monotonic
    lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self, request: dict[str, Any]) -> dict[str, Any]:
        """Open a session (idempotent on its id). An open session of the same execution (the
        handler retried within one call: same step, attempt and process) is closed now:
        one worker thread runs those one after the other."""
        budget = float(request["budget"])
        if not budget > 0:
            raise RefusedError("no budget left: the agent is past its deadline")
        now = self.clock()
        session = Session(
            id=str(request["session"]),
            account=str(request["account"]),
            step_id=int(request["step_id"]),
            attempt=int(request["attempt"]),
            pid=int(request["pid"]),
            budget=budget,
            begin=now,
            wall=time.time(),
        )
        with self.lock:
            if session.id in self.sessions:
                return {"session": session.id}
            for other in list(self.sessions.values()):
                if (
                    other.execution() == session.execution()
                    and other.closed_at is None
                    and now < other.lease_end
                ):
                    self.sessions[other.id] = replace(other, closed_at=now)
            self.sessions[session.id] = session
        return {"session": session.id}

    def close(self, session_id: str, effect: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The effect call of session `session_id`: apply `effect` (under the lock, so a
        close and a lease's end never race) and close the session, or refuse it if its lease
        ended. A repeated close (a lost answer) applies the effect again (idempotent)."""
        with self.lock:
            session = self.sessions.get(session_id)
            if session is None:
                raise RefusedError(f"no session {session_id!r}")
            now = self.clock()
            if session.closed_at is None and now > session.lease_end:
                if not session.refused:
                    self.late_effects += 1
                    self.sessions[session_id] = replace(session, refused=True)
                late = now - session.lease_end
                raise RefusedError(f"session {session_id} lease ended {late:.3f}s ago")
            if session.refused:
                raise RefusedError(f"session {session_id} lease ended")
            result = effect()
            if session.closed_at is None:
                self.sessions[session_id] = replace(session, closed_at=now)
            return result

    def release(self, session_id: str) -> dict[str, Any]:
        """The agent gives the session back without an effect (it gave up): closed now,
        unless its lease ended first."""
        with self.lock:
            session = self.sessions.get(session_id)
            if session is None:
                raise RefusedError(f"no session {session_id!r}")
            now = self.clock()
            if session.closed_at is None and now <= session.lease_end:
                self.sessions[session_id] = replace(session, closed_at=now)
        return {"session": session_id}

    def snapshot(self) -> tuple[list[Session], int]:
        with self.lock:
            return list(self.sessions.values()), self.late_effects


@dataclass(frozen=True)
class Overlap:
    account: str
    first: Session
    second: Session

    @property
    def seconds(self) -> float:
        return min(self.first.end, self.second.end) - self.second.begin

    def describe(self) -> str:
        a, b = self.first, self.second
        at = time.strftime("%H:%M:%S", time.gmtime(b.wall)) + f".{int(b.wall % 1 * 1000):03d}"
        return (
            f"{self.account}: step {a.step_id}#{a.attempt} (pid {a.pid}) and "
            f"step {b.step_id}#{b.attempt} (pid {b.pid}) for {self.seconds:.3f}s from {at} UTC"
        )


def overlaps(sessions: Iterable[Session]) -> list[Overlap]:
    """Every pair of sessions of one account whose intervals overlap (half-open: one ending
    at the instant another begins does not), sorted by account and start."""
    by_account: dict[str, list[Session]] = defaultdict(list)
    for session in sessions:
        by_account[session.account].append(session)
    found = []
    for account, group in sorted(by_account.items()):
        group.sort(key=lambda s: (s.begin, s.id))
        for i, first in enumerate(group):
            for second in group[i + 1 :]:
                if second.begin >= first.end:
                    break  # sorted by begin: the later ones begin after `first` ended too
                if first.begin < second.end:
                    found.append(Overlap(account, first, second))
    return found


def max_concurrent(sessions: Iterable[Session]) -> dict[str, int]:
    """Per account, the most sessions open at one instant (a sweep over begins and ends; an
    end at the instant of a begin is counted first)."""
    points: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for s in sessions:
        points[s.account] += [(s.begin, 1), (s.end, -1)]
    most = {}
    for account, marks in points.items():
        level = peak = 0
        for _, delta in sorted(marks):
            level += delta
            peak = max(peak, level)
        most[account] = peak
    return most


def same_execution_kinds(found: Iterable[Overlap]) -> tuple[list[Overlap], list[Overlap]]:
    """Split overlaps into those between different steps or attempts (the invariant) and
    those between two executions of one attempt (a redelivered request)."""
    between: list[Overlap] = []
    within: list[Overlap] = []
    for overlap in found:
        a, b = overlap.first, overlap.second
        (within if (a.step_id, a.attempt) == (b.step_id, b.attempt) else between).append(overlap)
    return between, within
