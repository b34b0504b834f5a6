"""The statements of `sasflow runs migrate` (sasflow.ops.migrate): find the runs of a workflow
version, and move one run's step records to another version's graph.

The caller locks the run (`transitions.lock_run`) and then its forward steps
(`lock_forward_steps`) before any change, so schedulers (whose claim skips locked rows), the
supervisor and other operators wait for the migration's commit.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Row, delete, insert, select, update

from sasflow.states import StepKind, StepState
from sasflow.store.runs.step_rows import forward_definition, step_row
from sasflow.store.schema import runs, steps
from sasflow.store.sqltime import now
from sasflow.workflow import Workflow

_RENAMING = "~migrating~"
"""The prefix of a renamed step's name inside the transaction: renames go through it, so a
swap (a->b, b->a) never meets uq_steps_run_id_kind_name half done. No step name has a '~'."""


def runs_of_version(
    conn: Connection, workflow: str, version: int, states: Collection[str]
) -> list[int]:
    """The ids of the runs of `workflow` at `version` in `states`, oldest first (no index
    serves the version: the scan of the workflow's runs an operator's bulk action pays)."""
    return list(
        conn.execute(
            select(runs.c.id)
            .where(
                runs.c.workflow == workflow,
                runs.c.version == version,
                runs.c.state.in_(sorted(states)),
            )
            .order_by(runs.c.id)
        ).scalars()
    )


def lock_forward_steps(conn: Connection, run_id: int) -> Sequence[Row[*tuple[Any, ...]]]:
    """The run's forward steps (run id, id, name, state, attempt), locked
    (uq_steps_run_id_kind_name)."""
    return conn.execute(
        select(steps.c.run_id, steps.c.id, steps.c.name, steps.c.state, steps.c.attempt)
        .where(steps.c.run_id == run_id, steps.c.kind == StepKind.FORWARD)
        .order_by(steps.c.id)
        .with_for_update()
    ).all()


def delete_steps(conn: Connection, step_ids: Collection[int]) -> None:
    """Delete steps that never started; their events keep their history (primary key)."""
    if step_ids:
        conn.execute(delete(steps).where(steps.c.id.in_(sorted(step_ids))))


def rename_steps(conn: Connection, renames: Mapping[int, str]) -> None:
    """Give each step (by id) its new name, in two passes through a name no step has
    (primary key)."""
    for step_id in renames:
        conn.execute(
            update(steps).where(steps.c.id == step_id).values(name=f"{_RENAMING}{step_id}")
        )
    for step_id, name in renames.items():
        conn.execute(update(steps).where(steps.c.id == step_id).values(name=name))


def redefine_not_started(
    conn: Connection, step_id: int, workflow: Workflow, name: str, *, run_pool: str | None
) -> None:
    """A step that has not started takes `workflow`'s definition of `name` whole (agent,
    action, policy, dependencies, pool) and waits: advancing the run makes it pending with its
    input once its new dependencies are processed. Its idempotency key stays (primary key)."""
    definition = forward_definition(workflow, name)
    definition.update(
        state=StepState.WAITING,
        input=None,
        pool=workflow.step(name).pool or run_pool,
        deferred_since=None,
        pool_looks=0,
        pool_waiting_since=None,
        not_before=now(),
        updated_at=now(),
    )
    conn.execute(update(steps).where(steps.c.id == step_id).values(**definition))


def repoint_started(conn: Connection, step_id: int, depends_on: Sequence[str]) -> None:
    """A step that started keeps its record as it ran (agent, action, policy, compensating
    action, state, attempt, output): only its dependencies follow the new graph (primary
    key)."""
    conn.execute(
        update(steps)
        .where(steps.c.id == step_id)
        .values(depends_on=list(depends_on), updated_at=now())
    )


def add_steps(
    conn: Connection,
    workflow: Workflow,
    names: Sequence[str],
    *,
    run_id: int,
    priority: int,
    run_pool: str | None,
) -> list[Row[*tuple[Any, ...]]]:
    """Insert `workflow`'s steps `names` for the run, waiting, with fresh idempotency keys;
    returns their run id, id and name."""
    if not names:
        return []
    rows = []
    for name in names:
        row = step_row(
            forward_definition(workflow, name),
            run_id=run_id,
            priority=priority,
            input=None,
            pool=workflow.step(name).pool or run_pool,
        )
        row["state"] = StepState.WAITING
        rows.append(row)
    return list(
        conn.execute(insert(steps).returning(steps.c.run_id, steps.c.id, steps.c.name), rows).all()
    )


def set_version(conn: Connection, run_id: int, workflow: Workflow) -> None:
    """The run follows `workflow`'s version and failure policy from now on (primary key)."""
    conn.execute(
        update(runs)
        .where(runs.c.id == run_id)
        .values(version=workflow.version, on_failure=workflow.on_failure, updated_at=now())
    )
