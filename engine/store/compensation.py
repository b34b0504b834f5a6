"""Compensation: undo a failed run's processed steps, in reverse order, as steps of their own.

Compensation steps are rows of kind `compensation` (one per processed step that names a
compensating action), chained so that each waits for the one before: the steps are undone in
reverse topological order of the workflow. They are claimed, dispatched, deadlined and
supervised like any step; the run goes `compensating` -> `compensated`, or
`compensation_failed` (with an alert) when one of them fails for good.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert

from sasflow.states import StepKind, StepState
from sasflow.store.schema import steps
from sasflow.store.step_rows import POLICY_COLUMNS, defined_columns, step_row


def reverse_topological(rows: Sequence[Any]) -> list[Any]:
    """Forward step rows ordered so that every step comes before the steps it depends on."""
    by_name = {r.name: r for r in rows}
    done: set[str] = set()
    order: list[Any] = []
    pending = list(rows)
    while pending:
        progressed = False
        for row in list(pending):
            if all(d in done or d not in by_name for d in row.depends_on):
                order.append(row)
                done.add(row.name)
                pending.remove(row)
                progressed = True
        if not progressed:  # a stored cycle cannot exist (definitions are validated)
            order.extend(pending)
            break
    return list(reversed(order))


def create_chain(conn: Connection, run: Any, forward: Sequence[Any]) -> list[dict[str, Any]]:
    """Insert the compensation steps of `run`'s processed steps; returns the rows inserted."""
    to_undo = [
        r
        for r in reverse_topological(forward)
        if r.state == StepState.PROCESSED and r.compensate_action
    ]
    rows: list[dict[str, Any]] = []
    previous: str | None = None
    for step in to_undo:
        rows.append(
            step_row(
                defined_columns(
                    name=step.name,
                    kind=StepKind.COMPENSATION,
                    agent=step.agent,
                    action=step.compensate_action,
                    depends_on=[previous] if previous else [],
                    policy={column: getattr(step, column) for column in POLICY_COLUMNS},
                    pool=step.pool,
                ),
                run_id=run.id,
                priority=step.priority,
                input={"input": step.input, "output": step.output},
                pool=step.pool,
            )
        )
        previous = step.name
    if rows:
        ids = conn.execute(
            insert(steps).returning(steps.c.id, steps.c.name, sort_by_parameter_order=True), rows
        ).all()
        for row, inserted in zip(rows, ids, strict=True):
            row["id"] = inserted.id
    return rows
