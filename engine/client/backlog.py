"""Wait for room in a workflow's backlog before submitting (the `block` policy of Python
callers), in short transactions of sasflow's own, never inside the caller's."""

from __future__ import annotations

import time
from datetime import timedelta

from sasflow.backpressure import DEFAULT_MAX_BACKLOG, Room, bound_of
from sasflow.errors import ConfigurationError
from sasflow.registry import Registry
from sasflow.store.db import Engine, transaction
from sasflow.store.runs.backlog import read_backlog

DEFAULT_POLL_S = 0.5
"""Seconds between two reads of the backlog while waiting."""


def wait_for_room(
    engine: Engine,
    registry: Registry,
    workflow: str,
    *,
    timeout: float,
    max_backlog: int = DEFAULT_MAX_BACKLOG,
    poll: float = DEFAULT_POLL_S,
) -> Room:
    """Return once `workflow` has fewer runs waiting to start than its bound (the
    `max_backlog` of its latest version, else `max_backlog`; 0: no bound: returns at once);
    raise BacklogFullError when it still has none after `timeout` seconds, measured on the
    database's clock.

    Each read is a transaction of its own on `engine` (one capped count, docs/backpressure.md):
    call it before opening the transaction that submits, so that no transaction of yours stays
    open while it waits. Another process may take the room before you submit: submit with
    `on_backlog="reject"` to be told, or "accept" to record the run anyway.
    """
    if not (timeout >= 0 and poll > 0):
        raise ConfigurationError(f"timeout must be >= 0 and poll > 0, got {timeout}, {poll}")
    if isinstance(max_backlog, bool) or not isinstance(max_backlog, int) or max_backlog < 0:
        raise ConfigurationError(f"max_backlog must be an integer >= 0, not {max_backlog!r}")
    definition = registry.workflow(workflow)
    bound = bound_of(definition, max_backlog)
    if bound is None:
        return Room(definition.name, 0, None)
    deadline = None
    while True:
        with transaction(engine) as conn:
            backlog = read_backlog(conn, definition.name, cap=bound)
        room = Room(definition.name, backlog.count, bound)
        if not room.full:
            return room
        if deadline is None:
            deadline = backlog.db_now + timedelta(seconds=timeout)
        if backlog.db_now >= deadline:
            raise room.refusal()
        time.sleep(poll)
