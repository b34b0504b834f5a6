"""Record many runs in one statement on PostgreSQL: the runs, their step records, their first
events and the schedulers' wake-up, in one round trip whatever the batch's size.

`submit.submit` takes this path for one run, the submitter for a batch of deliveries, and
schedules for a fire batch. It serves the workflows whose first steps take the run's input as
it is (the default input builder): their step records need nothing the database has not got.
A workflow whose first step builds its input in Python (from the run id, say) takes the
generic path in submit.py instead, and so does SQLite.

The statement (`_SQL`) is one text whatever the batch holds, so psycopg prepares it once per
connection: the runs and the step templates of their workflows travel as two JSON documents,
unpacked with `jsonb_to_recordset`, and the step records are the cross product of the runs
actually inserted (`ON CONFLICT DO NOTHING ... RETURNING`) and their workflow's template.
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

from sasflow.errors import ConflictError, InvalidInputError, InvalidMessageError
from sasflow.messages import dumps
from sasflow.registry import Registry
from sasflow.states import RunState, StepKind, StepState
from sasflow.store.commands import NewRun, SubmitResult
from sasflow.store.db import is_message_fault
from sasflow.store.dialect import POSTGRESQL
from sasflow.store.notify import channel
from sasflow.store.step_rows import policy_columns
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
    try:
        input_json = dumps(new.input)
    except InvalidMessageError as exc:
        raise InvalidInputError(f"run input: {exc}") from exc
    return Prepared(new, workflow, new.key or uuid.uuid4().hex, input_json)


def one_statement(bind: Connection | Engine, workflow: Workflow) -> bool:
    """True when runs of `workflow` can be recorded here: PostgreSQL through psycopg (the
    statement is written in its parameter style; an application's `submit_run` on another
    driver takes the generic path), and every first step takes the run's input as it is."""
    dialect = bind.dialect
    return (
        dialect.name == POSTGRESQL
        and dialect.driver == "psycopg"
        and _template(workflow) is not None
    )


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
        rows = []
        for i, name in enumerate(workflow.order):
            step = workflow.step(name)
            deps = workflow.dependencies[name]
            rows.append(
                {
                    "i": i,
                    "name": name,
                    "agent": step.agent,
                    "action": step.action,
                    "compensate_action": step.compensate,
                    "depends_on": list(deps),
                    "state": StepState.WAITING if deps else StepState.PENDING,
                    "root": not deps,
                    "pool": step.pool,
                    **policy_columns(step.policy),
                }
            )
        entry = f"{json.dumps(_template_key(workflow))}:{json.dumps(rows, allow_nan=False)}"
    _TEMPLATES[workflow] = entry
    return entry


def _template_key(workflow: Workflow) -> str:
    return f"{workflow.name}@{workflow.version}"


_RUN_FIELDS = (
    "n int, workflow text, version int, business_key text, input jsonb, priority int, "
    "reply_to text, submitted_by text, callback_url text, pool text, trace_parent text, "
    "on_failure text"
)
_STEP_FIELDS = (
    "i int, name text, agent text, action text, compensate_action text, depends_on jsonb, "
    "state text, root boolean, pool text, timeout_s float8, max_failures int, "
    "backoff_initial_s float8, backoff_multiplier float8, backoff_max_s float8, give_up_s float8"
)
_POLICY = "timeout_s, max_failures, backoff_initial_s, backoff_multiplier, backoff_max_s, give_up_s"

_SQL = f"""
WITH b AS (
  SELECT * FROM jsonb_to_recordset(%(runs)s::jsonb) AS b({_RUN_FIELDS})
), r AS (
  INSERT INTO runs (workflow, version, business_key, input, priority, state, reply_to,
                    submitted_by, callback_url, pool, trace_parent, on_failure)
  SELECT workflow, version, business_key, input, priority, '{RunState.PENDING}', reply_to,
         submitted_by, callback_url, pool, trace_parent, on_failure
  FROM b ORDER BY n
  ON CONFLICT (workflow, business_key) DO NOTHING
  RETURNING id, workflow, version, business_key, input, priority, pool
), s AS (
  INSERT INTO steps (run_id, name, kind, agent, action, compensate_action, depends_on, state,
                     priority, idempotency_key, input, pool, {_POLICY})
  SELECT r.id, t.name, '{StepKind.FORWARD}', t.agent, t.action, t.compensate_action,
         t.depends_on, t.state, r.priority, replace(gen_random_uuid()::text, '-', ''),
         CASE WHEN t.root THEN r.input END, coalesce(t.pool, r.pool), {_POLICY}
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
"""Runs, steps (idempotency keys drawn in the database, as uuid4().hex), the `pending` event
with reason "received" (events.record writes nothing else for a run that is not terminal) and
one NOTIFY when anything was inserted (a SELECT in a WITH runs only when referenced: `woken`
references it; it sends nothing when no run was inserted)."""


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
            raise ValueError(f"workflow {p.workflow.name!r} needs the generic submission path")
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
        if kept != p.new.input:
            log.warning(
                "duplicate submission of %s key %r with a different input: run %s kept as is",
                p.workflow.name,
                p.key,
                run_id,
            )
        results.append(SubmitResult(run_id, p.key, created=False, state=state))
    return results


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
