"""Items of a map ended, without reading the run: the map's items counted by state and the next
waiting ones released, each by `ix_steps_map_items` (docs/concepts.md, "Map steps", Cost).

A reply that ends an item of a map (and nothing else of its run) changes nothing of the run
but that map: while the map goes on, what follows is only how many waiting items it releases
(`mapping.to_release`). So the transaction that applies it reads the map's record (primary key)
and three indexed counts of its items, and releases the next items in index order with one
UPDATE, instead of reading every step of the run for `decide`: ending an item costs the same
for a map of 10 items or of 100,000. When the map ends (its last item ended, or one failed and
it does not continue) this returns None: the caller reads the run and decides it whole, once.

The caller holds the run's row lock (queries.lock_runs_of_steps), so two appliers of one map's
items never both release the same slot.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any

from sqlalchemy import Connection, Integer, Select, Update, bindparam, exists, func, select, update

from sasflow.states import ACTIVE_RUN_STATES, StepState
from sasflow.store.runs.events import Event, step_event
from sasflow.store.runs.mapping import (
    OPEN_ITEM_STATES,
    RUNNING_ITEM_STATES,
    ItemCounts,
    running_over,
    to_release,
)
from sasflow.store.runs.records import RunRecord
from sasflow.store.schema import steps
from sasflow.store.sqltime import now


def drain_items(
    conn: Connection, run: RunRecord, maps: Iterable[int], *, actor: str
) -> list[Event] | None:
    """The items of `maps` (their records' ids) of `run` ended: release the next waiting items
    of each; their events. None when this is not enough (the run is not going forward, a
    record is not a running map, or a map ends now): the caller decides the run whole."""
    if run.state not in ACTIVE_RUN_STATES:
        return None
    releases: list[tuple[int, int]] = []
    for map_id in sorted(set(maps)):
        record = conn.execute(map_record(), {"b_id": map_id}).first()
        spec = running_over(record.state, record.input) if record is not None else None
        if spec is None:
            return None
        row = conn.execute(item_counts(), {"b_parent": map_id}).one()
        free = to_release(spec, ItemCounts(row.running, bool(row.failed), bool(row.open)))
        if free is None:
            return None
        if free:
            releases.append((map_id, free))
    found: list[Event] = []
    for map_id, free in releases:
        released = conn.execute(release_items(), {"b_parent": map_id, "b_free": free})
        found += [
            step_event(row, StepState.WAITING, StepState.PENDING, actor=actor, reason="map")
            for row in sorted(released, key=lambda r: r.id)
        ]
    return found


@cache
def map_record() -> Select[Any]:
    """A map's own record: its state and what it runs over (primary key)."""
    return select(steps.c.state, steps.c.input).where(steps.c.id == bindparam("b_id"))


@cache
def item_counts() -> Select[Any]:
    """A map's items: how many are running, whether one failed, whether one is not ended
    (ix_steps_map_items: each a range of the map's entries in one state or a few, never its
    whole list)."""
    parent = steps.c.map_parent == bindparam("b_parent")
    running = (
        select(func.count())
        .select_from(steps)
        .where(parent, steps.c.state.in_(sorted(RUNNING_ITEM_STATES)))
        .scalar_subquery()
    )
    failed = exists().where(parent, steps.c.state == StepState.ERROR)
    still = exists().where(parent, steps.c.state.in_(sorted(OPEN_ITEM_STATES)))
    return select(running.label("running"), failed.label("failed"), still.label("open"))


@cache
def release_items() -> Update:
    """The first :b_free waiting items of a map, in index order, become pending now; their ids
    and names (ix_steps_map_items, then primary keys)."""
    first = (
        select(steps.c.id)
        .where(steps.c.map_parent == bindparam("b_parent"), steps.c.state == StepState.WAITING)
        .order_by(steps.c.map_index)
        .limit(bindparam("b_free", type_=Integer()))
        .scalar_subquery()
    )
    return (
        update(steps)
        .where(steps.c.id.in_(first), steps.c.state == StepState.WAITING)
        .values(state=StepState.PENDING, not_before=now(), updated_at=now())
        .returning(steps.c.id, steps.c.run_id, steps.c.name)
    )
