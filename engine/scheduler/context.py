"""What the parts of one scheduler share: who it is, its connections, its counters, its wake-up."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sasflow.hooks import Hooks
from sasflow.registry import Registry
from sasflow.store.db import Engine
from sasflow.transport.base import Transport
from sasflow.transport.topology import Names


@dataclass
class SchedulerStats:
    claimed: int = 0
    dispatched: int = 0
    released: int = 0
    applied: int = 0
    dropped: int = 0
    dead_lettered: int = 0
    started: int = 0
    """Agents' `started` messages applied (their steps' execution clocks started)."""
    heartbeats: int = 0
    ignored: int = 0
    """Messages on the replies queue of a kind this version does not know, acked unapplied."""


@dataclass(frozen=True)
class Context:
    """Handed to each part by the loop; everything in it belongs to the loop's thread, but
    `wake`, which any thread may set."""

    id: str
    """The scheduler's process id: `locked_by` of its claims, the actor of what it records."""
    engine: Engine
    transport: Transport
    registry: Registry
    names: Names
    hooks: Hooks
    stats: SchedulerStats
    wake: threading.Event
    """Set: claim at the next pass (a notification, an applied reply, a full batch)."""
    advance: threading.Event
    """Set: look for runs to advance at the next pass (one was left to the advance duty)."""


class Part:
    """A part of the scheduler (dispatch, replies): keeps what it reads of the context on every
    pass as its own attributes, one attribute lookup instead of two on the hot path."""

    def __init__(self, ctx: Context) -> None:
        self._id = ctx.id
        self._engine = ctx.engine
        self._transport = ctx.transport
        self._registry = ctx.registry
        self._names = ctx.names
        self._hooks = ctx.hooks
        self._stats = ctx.stats
        self._wake = ctx.wake
        self._advance = ctx.advance
