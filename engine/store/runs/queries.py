"""The engine's hot statements, each named, each with the index that serves it.

Each builder is cached: a statement is built once per process (and SQLAlchemy caches its
compiled form), so callers call `queries.claim_ready()` where they execute it. Every time
comparison uses the database clock.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    ColumnElement,
    FromClause,
    Integer,
    Select,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    cast,
    exists,
    false,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql

from sasflow.states import ACTIVE_RUN_STATES, QUIET_STEP_STATES, RunState, StepKind, StepState
from sasflow.store.dialect import is_false, joined_value, least, one_of
from sasflow.store.schema import agent_pauses, events, runs, steps
from sasflow.store.sqltime import now, plus_seconds
from sasflow.store.types import Timestamp
from sasflow.waits import EVENT_AGENT
from sasflow.workflow import TIMER_AGENT

_processing_with_attempt = and_(
    steps.c.id == bindparam("b_step_id"),
    steps.c.attempt == bindparam("b_attempt"),
    steps.c.state == StepState.PROCESSING,
)


def leave_processing() -> dict[str, Any]:
    """The SET fragment of every transition out of `processing`: the step is no longer locked
    by a scheduler nor bound by a deadline, and no attempt of it is started."""
    return {"locked_by": None, "complete_by": None, "started_at": None, "updated_at": now()}


_run_columns = (
    runs.c.id,
    runs.c.workflow,
    runs.c.version,
    runs.c.business_key,
    runs.c.input,
    runs.c.state,
    runs.c.on_failure,
    runs.c.error,
    runs.c.callback_url,
    runs.c.parent_run_id,
)
"""What advancing a run reads of it (whether ending it writes a callback, and whether it is a
child whose parent's step waits for its end)."""


def not_timer(table: FromClause = steps) -> ColumnElement[bool]:
    """Not an agent-less step: a timer (`Step.sleep`, store.runs.timers) or an event wait
    (`Step.wait_for`, store.inbound); no agent claims those. Inlined, so the planner can match
    ix_steps_ready's predicate, which leaves them out: sleeping timers and open waits cost the
    claim nothing."""
    return and_(
        table.c.agent != literal_column(f"'{TIMER_AGENT}'"),
        table.c.agent != literal_column(f"'{EVENT_AGENT}'"),
    )


def not_paused_agent() -> ColumnElement[bool]:
    """Not a step of an agent or action an operator paused (ops/pause.py). The schedulers'
    flow plan leaves paused agents out of the claim already (no walk past their steps); this
    makes a pause exact for every claim that starts after it committed, before the plan is
    read again (an index probe of the tiny agent_pauses table per candidate step)."""
    return ~exists().where(
        agent_pauses.c.agent == steps.c.agent,
        agent_pauses.c.action.in_([literal_column("''"), steps.c.action]),
    )


def claimable_in_run() -> ColumnElement[bool]:
    """Steps of active runs not paused (ops/pause.py); in a compensating run, its compensation
    steps and the retries of forward steps whose earlier attempt has an unknown outcome (it
    must be known, and undone if it succeeded, before the run can be compensated). The claim
    reads the run's row by primary key for each ready step already (its state): the flag costs
    no further read, only the walk past a paused run's ready steps in ix_steps_ready."""
    return and_(
        is_false(runs.c.paused),
        or_(
            runs.c.state.in_(ACTIVE_RUN_STATES),
            and_(
                runs.c.state == RunState.COMPENSATING,
                or_(steps.c.kind == StepKind.COMPENSATION, steps.c.attempt > 0),
            ),
        ),
    )


def _ready(skipping: bool, only: bool = False) -> CTE:
    """Up to :batch ready steps, locked (ix_steps_ready); `skipping`: not those of the agents
    in :b_skip_agents (at their in-flight bound, scheduler/inflight.py); `only`: those of the
    agent in :b_only_agents (the budgeted claim's, when its budgets admit the whole batch;
    ix_steps_ready_agent).
    The locking select sits in a CTE: `WHERE id IN (... LIMIT n FOR UPDATE SKIP LOCKED)` can
    update more rows than the limit (PostgreSQL bug #15715)."""
    wanted = [
        steps.c.state == StepState.PENDING,
        steps.c.locked_by.is_(None),
        steps.c.not_before <= now(),
        not_timer(),
        claimable_in_run(),
        not_paused_agent(),
    ]
    if skipping:
        wanted.append(steps.c.agent.not_in(bindparam("b_skip_agents", expanding=True)))
    if only:
        wanted.append(steps.c.agent.in_(bindparam("b_only_agents", expanding=True)))
    return (
        select(steps.c.id)
        .join(runs, runs.c.id == steps.c.run_id)
        .where(*wanted)
        .order_by(steps.c.priority.desc(), steps.c.not_before, steps.c.id)
        .limit(bindparam("b_batch"))
        .with_for_update(of=steps, skip_locked=True)
        .cte("ready")
    )


def _chosen() -> CTE:
    """The steps :b_step_ids, chosen and locked by the budgeted claim (store/flow/claim.py),
    still pending (primary key)."""
    return (
        select(steps.c.id)
        .where(one_of(steps.c.id, "b_step_ids"), steps.c.state == StepState.PENDING)
        .cte("ready")
    )


def _claim(ready: CTE, *, budgeted: bool = False) -> Update:
    """The claim's SET. `budgeted`: the budgeted claim's, stamped with :b_at, the database
    time its rates admitted the steps at (read after the limits' locks), so `dispatched_at`
    and the deadline start when the rate started the step."""
    at = bindparam("b_at", type_=Timestamp()) if budgeted else now()
    return (
        update(steps)
        .where(steps.c.id == ready.c.id, runs.c.id == steps.c.run_id)
        .values(
            state=StepState.PROCESSING,
            locked_by=bindparam("b_locked_by"),
            attempt=steps.c.attempt + 1,
            # The envelope: waiting for an agent, then executing (docs/timeouts.md); an
            # agent's `started` replaces it with the execution deadline.
            complete_by=plus_seconds(at, steps.c.wait_timeout_s + steps.c.timeout_s),
            started_at=None,
            dispatched_at=at,
            updated_at=now(),
        )
    )


_claimed_columns = (
    steps.c.id,
    steps.c.run_id,
    steps.c.name,
    steps.c.kind,
    steps.c.agent,
    steps.c.action,
    steps.c.attempt,
    steps.c.input,
    steps.c.idempotency_key,
    steps.c.timeout_s,
    steps.c.complete_by,
    steps.c.priority,
    steps.c.pool,
    steps.c.wait_timeout_s,
    steps.c.heartbeat_timeout_s,
    steps.c.wait_expiries,
    steps.c.map_index,
    steps.c.map_size,
)


@cache
def claim_ready(*, skipping: bool = False, chosen: bool = False, only: bool = False) -> Update:
    """Lock up to :batch ready steps and mark them processing (ix_steps_ready), each row with
    `due` and `db_now` as `next_due` gives them (the claimed steps were ready, so they do not
    count): a claim that finds work needs no second statement to learn when to claim next.
    `chosen`: the steps :b_step_ids instead, which the budgeted claim locked (primary key).
    """
    ready = _chosen() if chosen else _ready(skipping, only)
    return _claim(ready, budgeted=chosen or only).returning(
        *_claimed_columns,
        joined_value(runs.c.workflow, runs.c.id == steps.c.run_id).label("workflow"),
        _next_due().scalar_subquery().label("due"),
        now().label("db_now"),
    )


@cache
def claim_and_start(
    *, skipping: bool = False, chosen: bool = False, only: bool = False
) -> Select[Any]:
    """PostgreSQL: `claim_ready`, `start_runs` and the events of both (`claim.claim_steps`
    records the same rows) in one statement, with data-modifying CTEs (ix_steps_ready, then
    primary keys; `chosen`: the steps :b_step_ids, primary key). The rows: `claim_ready`'s.
    The events go in in the order `claim_steps` records them: the runs started, by id, then the
    steps claimed, by id."""
    claimed = (
        _claim(_chosen() if chosen else _ready(skipping, only), budgeted=chosen or only)
        .returning(*_claimed_columns, runs.c.workflow.label("workflow"))
        .cte("claimed")
    )
    run_ids = cast(
        select(func.array_agg(claimed.c.run_id)).scalar_subquery(), postgresql.ARRAY(runs.c.id.type)
    )
    started = (
        update(runs)
        # = ANY(one array): the primary key, as start_runs; `IN (SELECT ...)` let the planner
        # hash-join a scan of every run.
        .where(
            runs.c.id == any_(run_ids),
            runs.c.state == RunState.PENDING,
        )
        .values(state=RunState.RUNNING, updated_at=now())
        .returning(runs.c.id)
        .cte("started")
    )
    actor = bindparam("b_locked_by", type_=events.c.actor.type)
    run_events = select(
        literal(0).label("part"),
        started.c.id.label("run_id"),
        null().label("step_id"),
        literal("run").label("entity"),
        null().label("step"),
        literal(RunState.PENDING.value).label("from_state"),
        literal(RunState.RUNNING.value).label("to_state"),
        null().label("attempt"),
        actor.label("actor"),
        null().label("detail"),
        false().label("published"),
    )
    step_events = select(
        literal(1),
        claimed.c.run_id,
        claimed.c.id,
        literal("step"),
        claimed.c.name,
        literal(StepState.PENDING.value),
        literal(StepState.PROCESSING.value),
        claimed.c.attempt,
        actor,
        func.jsonb_build_object("agent", claimed.c.agent, "action", claimed.c.action),
        literal(StepState.PROCESSING in QUIET_STEP_STATES),
    )
    both = union_all(run_events, step_events).subquery("both")
    columns = [c for c in both.c if c.name != "part"]
    recorded = (
        insert(events)
        .from_select(
            [c.name for c in columns],
            select(*columns).order_by(both.c.part, both.c.step_id, both.c.run_id),
        )
        .cte("recorded")
    )
    return select(
        claimed, _next_due().scalar_subquery().label("due"), now().label("db_now")
    ).add_cte(recorded)


def _next_due() -> Select[Any]:
    backing_off = steps.alias("backing_off")
    return select(func.min(backing_off.c.not_before)).where(
        backing_off.c.state == StepState.PENDING,
        backing_off.c.not_before > now(),
        not_timer(backing_off),
    )


@cache
def in_flight_by_agent() -> Select[Any]:
    """Steps :b_locked_by has in flight (processing), per agent (ix_steps_expiry)."""
    return (
        select(steps.c.agent, func.count().label("n"))
        .where(steps.c.state == StepState.PROCESSING, steps.c.locked_by == bindparam("b_locked_by"))
        .group_by(steps.c.agent)
    )


@cache
def next_due() -> Select[Any]:
    """When the earliest step now backing off becomes ready, and the database's time now
    (ix_steps_ready: pending steps only)."""
    return select(func.min(steps.c.not_before).label("due"), now().label("now")).where(
        steps.c.state == StepState.PENDING, steps.c.not_before > now(), not_timer()
    )


@cache
def start_runs() -> Update:
    """Runs whose first step was just claimed become running (primary key)."""
    return (
        update(runs)
        .where(one_of(runs.c.id, "b_run_ids"), runs.c.state == RunState.PENDING)
        .values(state=RunState.RUNNING, updated_at=now())
        .returning(runs.c.id)
    )


@cache
def release_claimed() -> Update:
    """Give back claimed steps whose request could not be published (primary key)."""
    return (
        update(steps)
        .where(
            one_of(steps.c.id, "b_step_ids"),
            steps.c.state == StepState.PROCESSING,
            steps.c.locked_by == bindparam("b_locked_by"),
        )
        .values(state=StepState.PENDING, **leave_processing())
        .returning(steps.c.id, steps.c.run_id, steps.c.name, steps.c.attempt)
    )


@cache
def lock_runs_of_steps() -> Select[Any]:
    """Lock, in id order, the runs owning the given steps, and read what advancing them needs
    (`advance_runs` takes these rows instead of reading them again): appliers of one run
    serialise here so a fan-in is never missed (primary keys)."""
    return (
        select(*_run_columns)
        .where(runs.c.id.in_(select(steps.c.run_id).where(one_of(steps.c.id, "b_step_ids"))))
        .order_by(runs.c.id)
        .with_for_update()
    )


_step_result = (steps.c.run_id, steps.c.name, steps.c.kind, steps.c.map_parent)


@cache
def complete_step() -> Update:
    """Fenced: record a processed attempt (primary key)."""
    return (
        update(steps)
        .where(_processing_with_attempt)
        .values(
            state=StepState.PROCESSED,
            output=bindparam("b_output"),
            error=None,
            deferred_since=None,
            **leave_processing(),
        )
        .returning(*_step_result)
    )


@cache
def complete_steps() -> Update:
    """PostgreSQL: `complete_step` for many steps in one statement, each fenced by its own
    attempt; :step_ids, :attempts and :outputs (JSON text, NULL for none) are parallel arrays
    (primary key)."""
    done = select(
        func.unnest(bindparam("b_step_ids", type_=postgresql.ARRAY(BigInteger))).label("id"),
        func.unnest(bindparam("b_attempts", type_=postgresql.ARRAY(Integer))).label("attempt"),
        func.unnest(bindparam("b_outputs", type_=postgresql.ARRAY(Text))).label("output"),
    ).subquery("done")
    return (
        update(steps)
        .where(
            steps.c.id == done.c.id,
            steps.c.attempt == done.c.attempt,
            steps.c.state == StepState.PROCESSING,
        )
        .values(
            state=StepState.PROCESSED,
            output=cast(done.c.output, postgresql.JSONB),
            error=None,
            deferred_since=None,
            **leave_processing(),
        )
        .returning(*_step_result, steps.c.id, steps.c.attempt)
    )


def _failed_state(parks: Any) -> Any:
    """The state of a step that failed for good: `parked` when `parks` (its policy), else
    `error`."""
    return case((parks, literal(StepState.PARKED.value)), else_=literal(StepState.ERROR.value))


@cache
def fail_step() -> Update:
    """Fenced: record a permanent failure of an attempt: error, or parked when its policy parks
    errors (primary key)."""
    return (
        update(steps)
        .where(_processing_with_attempt)
        .values(
            state=_failed_state(steps.c.park_errors),
            error=bindparam("b_error"),
            **leave_processing(),
        )
        .returning(*_step_result, steps.c.state)
    )


@cache
def defer_step() -> Update:
    """Fenced: park a step whose agent's breaker is open, without counting a failure, while it
    is younger than its give-up age (primary key)."""
    return (
        update(steps)
        .where(
            _processing_with_attempt,
            or_(
                steps.c.deferred_since.is_(None),
                plus_seconds(steps.c.deferred_since, steps.c.give_up_s) > now(),
            ),
        )
        .values(
            state=StepState.PENDING,
            not_before=plus_seconds(now(), bindparam("b_defer_seconds")),
            deferred_since=func.coalesce(steps.c.deferred_since, now()),
            error=bindparam("b_error"),
            **leave_processing(),
        )
        .returning(*_step_result, steps.c.not_before)
    )


def failure_values() -> dict[str, Any]:
    """SET clause counting one failure: below the threshold back to pending after an
    exponential, capped backoff (the database's clock), at the threshold to error (parked when
    its policy parks exhausted steps)."""
    failures = steps.c.failure_count + 1
    exhausted = failures >= steps.c.max_failures
    delay = least(
        steps.c.backoff_max_s,
        steps.c.backoff_initial_s
        * func.power(steps.c.backoff_multiplier, least(steps.c.failure_count, 64)),
    )
    return {
        "failure_count": failures,
        "state": case(
            (exhausted, _failed_state(steps.c.park_exhausted)),
            else_=literal(StepState.PENDING.value),
        ),
        "not_before": case((exhausted, steps.c.not_before), else_=plus_seconds(now(), delay)),
        "error": bindparam("b_error"),
        **leave_processing(),
    }


FAILURE_RESULT: tuple[Any, ...] = (
    *_step_result,
    steps.c.agent,
    steps.c.id,
    steps.c.state,
    steps.c.failure_count,
    steps.c.not_before,
    steps.c.attempt,
    steps.c.wait_expiries,
)
"""What the statements that count a failure (or return a step uncharged) return of a step."""


@cache
def count_failure() -> Update:
    """Fenced: count one failure of an attempt (primary key)."""
    return (
        update(steps)
        .where(_processing_with_attempt)
        .values(**failure_values())
        .returning(*FAILURE_RESULT)
    )


@cache
def expired_runs() -> Select[Any]:
    """The runs of up to :batch steps whose deadline passed, oldest first (ix_steps_expiry)."""
    return (
        select(steps.c.run_id)
        .where(steps.c.state == StepState.PROCESSING, steps.c.complete_by < now())
        .order_by(steps.c.complete_by)
        .limit(bindparam("b_batch"))
    )


@cache
def lock_runs(skip_locked: bool) -> Select[Any]:
    """Lock runs in id order (primary key). Whoever changes a run's steps and then advances it
    takes the run first, so schedulers, the supervisor and operators never deadlock."""
    return (
        select(runs.c.id)
        .where(one_of(runs.c.id, "b_run_ids"))
        .order_by(runs.c.id)
        .with_for_update(skip_locked=skip_locked)
    )


@cache
def stalled_steps() -> Select[Any]:
    """Ready steps nobody claimed for :stalled_after seconds, per agent (ix_steps_ready)."""
    return (
        select(
            steps.c.agent, func.count().label("steps"), func.min(steps.c.not_before).label("since")
        )
        .where(
            steps.c.state == StepState.PENDING,
            steps.c.not_before < plus_seconds(now(), -bindparam("b_stalled_after")),
            not_timer(),
        )
        .group_by(steps.c.agent)
    )


@cache
def steps_of_runs() -> Select[Any]:
    """Every step of the given runs, to advance them (uq_steps_run_id_kind_name)."""
    return select(steps).where(one_of(steps.c.run_id, "b_run_ids"))


@cache
def runs_by_id() -> Select[Any]:
    """The runs to advance, locked in id order (primary key): whoever advances a run (scheduler,
    supervisor, operator) holds its row, so two of them never both fail or finish it."""
    return (
        select(*_run_columns)
        .where(one_of(runs.c.id, "b_run_ids"))
        .order_by(runs.c.id)
        .with_for_update()
    )


@cache
def unpublished_events() -> Select[Any]:
    """The oldest events not yet published, locked for one relay (ix_events_unpublished), each
    with the id of its run's first unpublished event (`first_unpublished`,
    ix_events_run_unpublished),
    locked or not: `events.take_unpublished` keeps a run's events only when that one is among
    them, so a run's events are published and fanned out in order even when another relay holds
    an earlier one."""
    earlier = events.alias("earlier")
    first_unpublished = (
        select(func.min(earlier.c.id))
        .where(earlier.c.run_id == events.c.run_id, is_false(earlier.c.published))
        .scalar_subquery()
        .label("first_unpublished")
    )
    return (
        select(
            first_unpublished,
            events.c.id,
            events.c.run_id,
            events.c.step_id,
            events.c.entity,
            events.c.step,
            events.c.from_state,
            events.c.to_state,
            events.c.attempt,
            events.c.detail,
            events.c.reason,
            events.c.created_at,
            runs.c.business_key,
            runs.c.workflow,
            runs.c.version,
            runs.c.reply_to,
            runs.c.submitted_by,
        )
        .join(runs, runs.c.id == events.c.run_id)
        .where(is_false(events.c.published))
        .order_by(events.c.id)
        .limit(bindparam("b_limit"))
        .with_for_update(of=events, skip_locked=True)
    )


@cache
def mark_published() -> Update:
    """Mark relayed events (primary key)."""
    return update(events).where(one_of(events.c.id, "b_event_ids")).values(published=True)
