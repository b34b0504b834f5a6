"""The doors' reads of a workflow's backlog (sasflow.backpressure says what they mean).

`room_now` reads it in the caller's transaction, every time (`submit_run`). `BacklogGate`
keeps one read per workflow for READ_EVERY_S seconds, for the doors that admit many
submissions a second (the HTTP API's threads, the submitter): a read counts at most `bound`
index entries (store.runs.backlog), so the cost of a door's check is bounded by one such count a
second per workflow, whatever its traffic. Within that second the gate adds the door's own
admissions to the count it read, so one door never overshoots the bound by itself; several
doors may, by what each admits in one second (the bound is a soft one, docs/backpressure.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from sasflow.backpressure import READ_EVERY_S, Room, bound_of
from sasflow.store.db import Connection
from sasflow.store.runs.backlog import existing_keys, read_backlog
from sasflow.workflow import Workflow


def room_now(conn: Connection, workflow: Workflow, default_bound: int) -> Room:
    """`workflow`'s room, read now on `conn` (the caller's transaction sees its own runs)."""
    bound = bound_of(workflow, default_bound)
    if bound is None:
        return Room(workflow.name, 0, None)
    return Room(workflow.name, read_backlog(conn, workflow.name, cap=bound).count, bound)


def known_keys(conn: Connection, workflow: str, keys: Iterable[str]) -> set[str]:
    """The `keys` that already name a run of `workflow` (an idempotent resubmission is
    answered with its run, never refused)."""
    return existing_keys(conn, workflow, keys)


def admit_one(conn: Connection, room: Room, key: str | None) -> None:
    """Raise BacklogFullError when `room` is full, unless `key` already names a run of its
    workflow (then the submission is an idempotent resubmission: never refused)."""
    if not room.full:
        return
    if key is not None and known_keys(conn, room.workflow, [key]):
        return
    raise room.refusal()


class BacklogGate:
    """One process's reads of each workflow's backlog, reused for `every` seconds; safe from
    several threads (the HTTP API's handlers)."""

    def __init__(
        self,
        default_bound: int,
        *,
        every: float = READ_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.default_bound = default_bound
        self._every = every
        self._clock = clock
        self._rooms: dict[str, tuple[float, Room]] = {}
        self._lock = threading.Lock()

    def fresh(self, workflow: Workflow) -> Room | None:
        """`workflow`'s room without reading: unbounded, or the last read if it is recent
        enough (plus this process's admissions since); None when a read is due."""
        bound = bound_of(workflow, self.default_bound)
        return Room(workflow.name, 0, None) if bound is None else self._cached(workflow, bound)

    def _cached(self, workflow: Workflow, bound: int) -> Room | None:
        with self._lock:
            cached = self._rooms.get(workflow.name)
        if cached is None or cached[1].bound != bound or self._clock() - cached[0] >= self._every:
            return None
        return cached[1]

    def room(self, conn: Connection, workflow: Workflow) -> Room:
        """`workflow`'s room: `fresh` if it is, else a new read on `conn`."""
        bound = bound_of(workflow, self.default_bound)
        if bound is None:
            return Room(workflow.name, 0, None)
        known = self._cached(workflow, bound)
        if known is not None:
            return known
        now = self._clock()
        room = Room(workflow.name, read_backlog(conn, workflow.name, cap=bound).count, bound)
        with self._lock:
            self._rooms[workflow.name] = (now, room)
        return room

    def admitted(self, workflow: str, count: int) -> None:
        """This process admitted `count` runs of `workflow` since its last read."""
        if count <= 0:
            return
        with self._lock:
            cached = self._rooms.get(workflow)
            if cached is not None:
                self._rooms[workflow] = (cached[0], cached[1].admitting(count))
