"""Record many runs in one statement on PostgreSQL: the runs, their step records, their first
events and the schedulers' wake-up, in one round trip whatever the batch's size.

`submit.record_runs` takes this path where the engine's capabilities allow it
(`Capabilities.one_statement_submit`: PostgreSQL through psycopg), for one run (`submit_run`),
a submitter's batch of deliveries or a schedule's fire batch. It serves the workflows whose
first steps take the run's input as it is (the default input builder): their step records
need nothing the database has not got. A workflow whose first step builds its input in Python
(from the run id, say) takes the portable path in submit.py instead, and so does SQLite.

The statement (`_SQL`) is one text whatever the batch holds, so psycopg prepares it once per
connection: the runs and the step templates of their workflows travel as two JSON documents,
unpacked with `jsonb_to_recordset`, and the step records are the cross product of the runs
actually inserted (`ON CONFLICT DO NOTHING ... RETURNING`) and their workflow's template. The
template's fields and the step columns the statement writes derive from
`step_rows.STEP_COLUMNS`, the portable path's description of a step record.
"""

from __future__ import annotations

import json
import logging
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from sasflow.commands import NewRun, SubmitResult
from sasflow.errors import ConflictError, InvalidInputError, InvalidMessageError
from sasflow.messages import dumps
from sasflow.registry import Registry
from sasflow.states import RunState
from sasflow.store.db import is_message_fault
from sasflow.store.dialect import capabilities
from sasflow.store.notify import channel
from sasflow.store.runs.step_rows import (
    DEFINED_COLUMNS,
    NEW_IDEMPOTENCY_KEY_SQL,
    STEP_COLUMNS,
    forward_definition,
)
from sasflow.workflow import Workflow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """A submission checked against its workflow, with its key and its input as JSON text."""

    new: NewRun
    workflow: Workflow
    key: str
    input_json: str


def prepare(registry: Registry, new: NewRun) -> Prepared:
    """Resolve the workflow and check the input (UnknownWorkflowError, InvalidInputError)."""
    workflow = registry.workflow(new.workflow, new.version)
    if new.start_at is not None and new.start_at.utcoffset() is None:
        raise InvalidInputError(f"start_at must be timezone-aware, got {new.start_at.isoformat()}")
    try:
        input_json = dumps(new.input)
    except InvalidMessageError as exc:
        raise InvalidInputError(f"run input: {exc}") from exc
    return Prepared(new, workflow, new.key or uuid.uuid4().hex, input_json)


def one_statement(bind: Connection | Engine, workflow: Workflow) -> bool:
    """True when runs of `workflow` can be recorded here: the engine's capabilities allow it
    (`Capabilities.one_statement_submit`; an application's `submit_run` on another driver
    than psycopg takes the portable path), and every first step takes the run's input as it
    is."""
    return capabilities(bind).one_statement_submit and _template(workflow) is not None


_TEMPLATES: weakref.WeakKeyDictionary[Workflow, str | None] = weakref.WeakKeyDictionary()


def _template(workflow: Workflow) -> str | None:
    """The workflow's entry of the statement's `templates` document (`"name@version":
    [steps]`), built once per definition; None when a first step builds its own input."""
    try:
        return _TEMPLATES[workflow]
    except KeyError:
        pass
    entry: str | None = None
    if all(
        workflow.step(n).takes_run_input for n in workflow.order if not workflow.dependencies[n]
    ):
        rows = [
            {"i": i, "root": not workflow.dependencies[name], **forward_definition(workflow, name)}
            for i, name in enumerate(workflow.order)
        ]
        entry = f"{json.dumps(_template_key(workflow))}:{json.dumps(rows, allow_nan=False)}"
    _TEMPLATES[workflow] = entry
    return entry


def _template_key(workflow: Workflow) -> str:
    return f"{workflow.name}@{workflow.version}"


_RUN_FIELDS = (
    "n int, workflow text, version int, business_key text, input jsonb, priority int, "
    "reply_to text, submitted_by text, callback_url text, pool text, trace_parent text, "
    "on_failure text, deadline_s float8, on_deadline text"
)
_STEP_FIELDS = ", ".join(
    ["i int", "root boolean", *(f"{c.name} {c.defined}" for c in DEFINED_COLUMNS)]
)
"""A template's fields: the step's place in definition order, whether it depends on nothing
(it then takes the run's input), and the columns its definition gives."""

_FROM_RUN = {
    "run_id": "r.id",
    "priority": "r.priority",
    "idempotency_key": NEW_IDEMPOTENCY_KEY_SQL,
    "input": "CASE WHEN t.root THEN r.input END",
    "pool": "coalesce(t.pool, r.pool)",
}
"""The step columns the statement takes from the run inserted (`r`) or draws, rather than from
the template (`t`)."""


def _step_value(column: str, *, defined: bool) -> str:
    if column in _FROM_RUN:
        return _FROM_RUN[column]
    if not defined:
        raise TypeError(f"the one-statement submission does not know how to fill steps.{column}")
    return f"t.{column}"


_STEP_COLUMNS = ", ".join(c.name for c in STEP_COLUMNS)
_STEP_VALUES = ", ".join(_step_value(c.name, defined=c.defined is not None) for c in STEP_COLUMNS)

_SQL = f"""
WITH b AS (
  SELECT *, row_number() OVER (ORDER BY n) AS rank
  FROM jsonb_to_recordset(%(runs)s::jsonb) AS b({_RUN_FIELDS})
), drawn AS (
  SELECT nextval(pg_get_serial_sequence('runs', 'id')) AS id FROM b
), ids AS (
  SELECT id, row_number() OVER (ORDER BY id) AS rank FROM drawn
), r AS (
  INSERT INTO runs (id, workflow, version, business_key, input, priority, state, reply_to,
                    submitted_by, callback_url, pool, trace_parent, on_failure, deadline_at,
                    on_deadline)
  SELECT ids.id, workflow, version, business_key, input, priority, '{RunState.PENDING}',
         reply_to, submitted_by, callback_url, pool, trace_parent, on_failure,
         now() + deadline_s * interval '1 second', on_deadline
  FROM b JOIN ids USING (rank) ORDER BY workflow, business_key
  ON CONFLICT (workflow, business_key) DO NOTHING
  RETURNING id, workflow, version, business_key, input, priority, pool
), s AS (
  INSERT INTO steps ({_STEP_COLUMNS})
  SELECT {_STEP_VALUES}
  FROM r CROSS JOIN LATERAL jsonb_to_recordset(
    %(templates)s::jsonb -> (r.workflow || '@' || r.version)) AS t({_STEP_FIELDS})
  ORDER BY r.id, t.i
), e AS (
  INSERT INTO events (run_id, entity, to_state, actor, reason, detail, published)
  SELECT r.id, 'run', '{RunState.PENDING}', %(actor)s, 'received',
         jsonb_build_object('priority', r.priority), false
  FROM r ORDER BY r.id
), w AS (
  SELECT pg_notify(%(channel)s, '') WHERE %(notify)s AND EXISTS (SELECT FROM r)
)
SELECT r.id, r.workflow, r.business_key, (SELECT count(*) FROM w) AS woken FROM r
"""
"""Runs (rows inserted in (workflow, key) order, whatever the batch's: two batches with keys
in common lock them in one order, so they cannot deadlock; yet their ids follow the batch's
order: one id drawn per run, the smallest given to the first run, and so on), steps
(idempotency keys
drawn in the database: step_rows.NEW_IDEMPOTENCY_KEY_SQL), the
`pending` event with reason "received" (events.record writes nothing else for a run that is
not terminal) and one NOTIFY when anything was inserted (a SELECT in a WITH runs only when
referenced: `woken` references it; it sends nothing when no run was inserted)."""


def insert(
    conn: Connection,
    batch: Sequence[Prepared],
    *,
    actor: str,
    namespace: str,
    notify: bool = True,
) -> list[SubmitResult]:
    """Record `batch` (all of workflows `one_statement` accepts) in the caller's transaction;
    one result per submission, in order. A key seen earlier in the batch, or already in the
    database, is a duplicate (created False, a warning when its input differs).

    When the database refuses the data (`db.is_message_fault`) InvalidInputError is raised,
    and the caller's transaction must be rolled back: for one bad submission the whole
    statement fails, and the caller records the batch one submission at a time to find it.
    Any other database error is raised as is.
    """
    if not batch:
        return []
    first: dict[tuple[str, str], int] = {}
    docs: list[str] = []
    templates: dict[str, str] = {}
    for i, p in enumerate(batch):
        identity = (p.workflow.name, p.key)
        if identity in first:
            continue
        first[identity] = i
        entry = _template(p.workflow)
        if entry is None:
            raise ValueError(f"workflow {p.workflow.name!r} needs the portable submission path")
        templates[_template_key(p.workflow)] = entry
        new = p.new
        head = json.dumps(
            {
                "n": i,
                "workflow": p.workflow.name,
                "version": p.workflow.version,
                "business_key": p.key,
                "priority": new.priority,
                "reply_to": new.reply_to,
                "submitted_by": new.submitted_by,
                "callback_url": new.callback_url,
                "pool": new.pool,
                "trace_parent": new.trace_parent,
                "on_failure": p.workflow.on_failure.value,
                **_deadline(p.workflow),
            }
        )
        docs.append(f'{head[:-1]},"input":{p.input_json}}}')
    try:
        rows = conn.exec_driver_sql(
            _SQL,
            {
                "runs": f"[{','.join(docs)}]",
                "templates": f"{{{','.join(templates.values())}}}",
                "actor": actor,
                "channel": channel(namespace),
                "notify": notify,
            },
        ).all()
    except DBAPIError as exc:
        if is_message_fault(exc):
            raise InvalidInputError(f"database rejected the submission: {exc.orig}") from exc
        raise
    created = {(row.workflow, row.business_key): row.id for row in rows}
    existing = _existing([k for k in first if k not in created], conn)
    results: list[SubmitResult] = []
    for i, p in enumerate(batch):
        identity = (p.workflow.name, p.key)
        run_id = created.get(identity)
        if run_id is not None and first[identity] == i:
            results.append(SubmitResult(run_id, p.key, created=True, state=RunState.PENDING))
            continue
        if run_id is not None:  # a duplicate of a run this batch created
            kept, state = batch[first[identity]].new.input, RunState.PENDING
        else:
            found = existing.get(identity)
            if found is None:  # removed (e.g. pruned) since the insert found it: try again
                raise ConflictError(
                    f"run {p.workflow.name} key {p.key!r} went away while the submission "
                    "waited for it; retry"
                )
            run_id, state, kept = found
        differs = kept != p.new.input
        if differs:
            log.warning(
                "duplicate submission of %s key %r with a different input: run %s kept as is",
                p.workflow.name,
                p.key,
                run_id,
            )
        results.append(
            SubmitResult(run_id, p.key, created=False, state=state, input_differs=differs)
        )
    return results


def _deadline(workflow: Workflow) -> dict[str, Any]:
    """The run's deadline fields (`deadline_s` NULL: none; `deadline_at` is NULL then)."""
    if workflow.deadline is None:
        return {"deadline_s": None, "on_deadline": None}
    return {"deadline_s": workflow.deadline, "on_deadline": workflow.on_deadline.value}


_EXISTING_SQL = """
SELECT r.id, r.state, r.input, r.workflow, r.business_key
FROM runs AS r JOIN unnest(%(workflows)s::text[], %(keys)s::text[]) AS k(workflow, business_key)
  ON r.workflow = k.workflow AND r.business_key = k.business_key
"""


def _existing(
    identities: Sequence[tuple[str, str]], conn: Connection
) -> dict[tuple[str, str], tuple[int, RunState, Any]]:
    """The runs already recorded under these (workflow, key): id, state and input. A new
    statement, so it sees a run that a concurrent transaction committed while the insert
    waited for it."""
    if not identities:
        return {}
    rows = conn.exec_driver_sql(
        _EXISTING_SQL,
        {"workflows": [w for w, _ in identities], "keys": [k for _, k in identities]},
    ).all()
    return {
        (row.workflow, row.business_key): (row.id, RunState(row.state), row.input) for row in rows
    }
