"""Compensation: undo a failed run's processed steps, in reverse order, as steps of their own.

Compensation steps are rows of kind `compensation` (one per processed step that names a
compensating action), chained so that each waits for the one before: the steps are undone in
reverse topological order of the workflow (a map's items in reverse index order; a child step by
compensating its child run, store.runs.children). They are
claimed, dispatched, deadlined and supervised like any step; the run goes `compensating` ->
`compensated`, or `compensation_failed` (with an alert) when one of them fails for good.

This module says which records the chain is made of (`store.decide` asks for them); the store
inserts them when it applies the decision (`store.advance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sasflow.children import CHILD_AGENT
from sasflow.states import StepKind, StepState
from sasflow.store.runs.records import StepRecord
from sasflow.store.runs.step_rows import POLICY_COLUMNS, defined_columns, step_row

CHILD_UNDO = "compensate"
"""The action of the compensation record that undoes a child step (`Step.child`)."""


def reverse_topological(records: Sequence[StepRecord]) -> list[StepRecord]:
    """Forward steps ordered so that every step comes before the steps it depends on."""
    by_name = {r.name: r for r in records}
    done: set[str] = set()
    order: list[StepRecord] = []
    pending = list(records)
    while pending:
        progressed = False
        for record in list(pending):
            if all(d in done or d not in by_name for d in record.depends_on):
                order.append(record)
                done.add(record.name)
                pending.remove(record)
                progressed = True
        if not progressed:  # a stored cycle cannot exist (definitions are validated)
            order.extend(pending)
            break
    return list(reversed(order))


def undo_order(forward: Sequence[StepRecord]) -> list[StepRecord]:
    """The forward steps in the order they are undone: reverse topological, the items of a map
    (store.runs.mapping) in reverse index order where their map is (after the steps that
    follow the map, before the steps it follows)."""
    items: dict[int, list[StepRecord]] = {}
    for step in forward:
        if step.map_parent is not None:
            items.setdefault(step.map_parent, []).append(step)
    order: list[StepRecord] = []
    for step in reverse_topological([s for s in forward if s.map_parent is None]):
        order.append(step)
        order += sorted(items.pop(step.id, []), key=lambda s: -(s.map_index or 0))
    for orphans in items.values():  # a map's record is always read with its items
        order += sorted(orphans, key=lambda s: -(s.map_index or 0))
    return order


def chain(run_id: int, forward: Sequence[StepRecord]) -> list[dict[str, Any]]:
    """The compensation step records (step_rows.step_row values) that undo the processed steps
    of run `run_id`, first to run first; empty when nothing is to undo. A map's own record has
    no compensating action: its items carry it."""
    records: list[dict[str, Any]] = []
    previous: str | None = None
    for step in undo_order(forward):
        # A child step is undone by compensating its child run (store.runs.children).
        action = CHILD_UNDO if step.agent == CHILD_AGENT else step.compensate_action
        if step.state != StepState.PROCESSED or not action:
            continue
        record = step_row(
            defined_columns(
                name=step.name,
                kind=StepKind.COMPENSATION,
                agent=step.agent,
                action=action,
                depends_on=[previous] if previous else [],
                policy={column: getattr(step, column) for column in POLICY_COLUMNS},
                pool=step.pool,
            ),
            run_id=run_id,
            priority=step.priority,
            input={"input": step.input, "output": step.output},
            pool=step.pool,
        )
        if step.agent == CHILD_AGENT:  # never claimed: released by compensating its child
            record["state"] = StepState.WAITING
        records.append(record)
        previous = step.name
    return records
