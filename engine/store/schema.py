"""The state store's tables, defined once; Alembic migrations are checked against them."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB

from sasflow.store.sqltime import now
from sasflow.store.types import Timestamp

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

Json = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
Id = BigInteger().with_variant(Integer(), "sqlite")


def _ts(name: str, *, nullable: bool = True, default_now: bool = False) -> Column[object]:
    return Column(
        name,
        Timestamp(),
        nullable=nullable,
        server_default=now() if default_now else None,
    )


_DEADLINE_DUE = (
    "deadline_at IS NOT NULL AND deadline_fired_at IS NULL AND state IN ('pending', 'running')"
)

runs = Table(
    "runs",
    metadata,
    Column("id", Id, Identity(), primary_key=True),
    Column("workflow", String(100), nullable=False),
    Column("version", Integer, nullable=False),
    Column("business_key", String(200), nullable=False),
    Column("input", Json, nullable=False),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("state", String(20), nullable=False, server_default=text("'pending'")),
    Column("reply_to", String(255), nullable=True),
    # Who submitted it over the HTTP API (the token's name); NULL for AMQP and Python.
    Column("submitted_by", String(100), nullable=True),
    # POSTed the run's summary when it ends (the callbacks outbox), or NULL.
    Column("callback_url", String(2000), nullable=True),
    # The agent pool its steps go to unless a step names its own, or NULL (the shared queue).
    Column("pool", String(100), nullable=True),
    # W3C traceparent of the run's trace (tracing on): every span of the run joins it.
    Column("trace_parent", String(100), nullable=True),
    Column("on_failure", String(20), nullable=False, server_default=text("'error'")),
    # The run's optional deadline (docs/timeouts.md): set at submission on the database clock
    # from the workflow's `deadline`, what the supervisor does when it passes (`alert`,
    # `cancel`, `compensate`), and when it did (a deadline fires once).
    _ts("deadline_at"),
    Column("on_deadline", String(20), nullable=True),
    _ts("deadline_fired_at"),
    Column("output", Json, nullable=True),
    Column("error", Json, nullable=True),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    _ts("finished_at"),
    UniqueConstraint("workflow", "business_key"),
    Index("ix_runs_state_created_at", "state", "created_at"),
    # Serves the backlog (store.runs.backlog): the runs of one workflow waiting to start, in
    # submission order. Partial, so it holds the backlog only: a run leaves it when it starts.
    Index(
        "ix_runs_backlog",
        "workflow",
        "created_at",
        postgresql_where=text("state = 'pending'"),
        sqlite_where=text("state = 'pending'"),
    ),
    # Serves history retention (store.retention): finished runs by age. Partial, so inserting
    # a run and its state changes before it finishes never touch it.
    Index(
        "ix_runs_finished_at",
        "finished_at",
        postgresql_where=text("finished_at IS NOT NULL"),
        sqlite_where=text("finished_at IS NOT NULL"),
    ),
    # Serves the supervisor's deadline sweep: only active runs whose deadline has not fired.
    Index(
        "ix_runs_deadline_due",
        "deadline_at",
        postgresql_where=text(_DEADLINE_DUE),
        sqlite_where=text(_DEADLINE_DUE),
    ),
    # Paused by an operator (ops/pause.py): the claim takes none of its steps; steps in flight
    # finish and the run advances, its new steps wait pending. A flag, not a state: a paused
    # run keeps its state machine (running, compensating...) and resume is clearing one column.
    Column("paused", Boolean, nullable=False, server_default=false()),
    # A child run (Step.child): the run and step that started it; NULL for any other run.
    Column("parent_run_id", Id, nullable=True),
    Column("parent_step", String(100), nullable=True),
    # Advancing the run needs a scheduler that has its workflow version loaded (user code to
    # run: an input builder, the run's output; or a version the advancing scheduler lacked):
    # from when (database clock), or until when a scheduler holds it while it builds
    # (store.runs.deferred). NULL: nothing waits.
    _ts("advance_due"),
    # Serves the take of runs to advance (store.runs.deferred): partial, so only they are in it.
    Index(
        "ix_runs_advance_due",
        "advance_due",
        postgresql_where=text("advance_due IS NOT NULL"),
        sqlite_where=text("advance_due IS NOT NULL"),
    ),
    # Serves a run's children (store.runs.children): partial, so only child runs are in it.
    Index(
        "ix_runs_parent_run_id",
        "parent_run_id",
        postgresql_where=text("parent_run_id IS NOT NULL"),
        sqlite_where=text("parent_run_id IS NOT NULL"),
    ),
)

_PENDING_NOT_TIMER = "state = 'pending' AND agent <> 'sasflow.timer' AND agent <> 'sasflow.event'"
_PENDING_TIMER = "state = 'pending' AND agent = 'sasflow.timer'"
_OPEN_WAIT = "state = 'pending' AND agent = 'sasflow.event'"
"""The partial indexes' predicates; 'sasflow.timer' is `workflow.TIMER_AGENT` and
'sasflow.event' `waits.EVENT_AGENT` (a test checks)."""

steps = Table(
    "steps",
    metadata,
    Column("id", Id, Identity(), primary_key=True),
    Column("run_id", Id, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(100), nullable=False),
    Column("kind", String(20), nullable=False, server_default=text("'forward'")),
    Column("agent", String(100), nullable=False),
    Column("action", String(100), nullable=False),
    Column("compensate_action", String(100), nullable=True),
    Column("depends_on", Json, nullable=False),
    Column("state", String(20), nullable=False),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("locked_by", String(100), nullable=True),
    # The agent pool whose queue it is dispatched to (NULL: the agent's shared queue), and how
    # often and since when it waited for an instance of that pool (scheduler.pools).
    Column("pool", String(100), nullable=True),
    Column("pool_looks", Integer, nullable=False, server_default=text("0")),
    _ts("pool_waiting_since"),
    # The deadline of the clock that runs now (docs/timeouts.md): at the claim the whole envelope
    # (wait + execution), from the agent's `started` its execution (or heartbeat) deadline.
    _ts("complete_by"),
    _ts("dispatched_at"),
    # When an agent said it started this attempt (NULL: not yet; cleared at every claim and
    # whenever the step leaves `processing`).
    _ts("started_at"),
    # Wait-clock expiries in a row (no agent took the request): not failures; reset when an
    # agent starts the step.
    Column("wait_expiries", Integer, nullable=False, server_default=text("0")),
    _ts("not_before", nullable=False, default_now=True),
    _ts("deferred_since"),
    Column("failure_count", Integer, nullable=False, server_default=text("0")),
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    Column("idempotency_key", String(100), nullable=False),
    Column("input", Json, nullable=True),
    Column("output", Json, nullable=True),
    Column("error", Json, nullable=True),
    # The step's policy, copied from the definition at submission (a run keeps its version).
    Column("timeout_s", Float, nullable=False),
    Column("wait_timeout_s", Float, nullable=False, server_default=text("30")),
    Column("heartbeat_timeout_s", Float, nullable=True),
    Column("max_failures", Integer, nullable=False),
    Column("backoff_initial_s", Float, nullable=False),
    Column("backoff_multiplier", Float, nullable=False),
    Column("backoff_max_s", Float, nullable=False),
    Column("give_up_s", Float, nullable=False),
    # Whether the step parks instead of failing when its failures run out, and when its agent
    # answers a permanent error (Workflow.parks; docs/operations.md "Parked steps").
    Column("park_exhausted", Boolean, nullable=False, server_default=false()),
    Column("park_errors", Boolean, nullable=False, server_default=false()),
    # An open event wait's correlation value (Step.wait_for), set when it opens; NULL otherwise.
    Column("correlation", String(200), nullable=True),
    # When an open approval (Step.approval) with `escalate_after` becomes overdue; NULL once its
    # `approval_overdue` alert is raised, or it is decided or timed out (store.approvals).
    _ts("escalate_at"),
    # An item of a map step (Step.map): the map's own record, the item's index and how many
    # items the map has (its request carries both); NULL for every other step.
    Column("map_parent", Id, nullable=True),
    Column("map_index", Integer, nullable=True),
    Column("map_size", Integer, nullable=True),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    UniqueConstraint("run_id", "kind", "name"),
    # Serves the claim: only ready steps are in it, in claim order; not timer steps (their own
    # index below), so sleeping timers cost the claim nothing (queries.not_timer).
    Index(
        "ix_steps_ready",
        text("priority DESC"),
        "not_before",
        "id",
        postgresql_where=text(_PENDING_NOT_TIMER),
        sqlite_where=text(_PENDING_NOT_TIMER),
    ),
    # Serves the timer duty (store.runs.timers): sleeping timer steps by wake-up time.
    Index(
        "ix_steps_timers",
        "not_before",
        "id",
        postgresql_where=text(_PENDING_TIMER),
        sqlite_where=text(_PENDING_TIMER),
    ),
    # Serves matching an event to open waits (store.inbound.match): by event name and
    # correlation; and their timeouts by deadline (`not_before`). Open waits are out of the claim.
    Index(
        "ix_steps_event_waits",
        "action",
        "correlation",
        postgresql_where=text(_OPEN_WAIT),
        sqlite_where=text(_OPEN_WAIT),
    ),
    Index(
        "ix_steps_event_timeouts",
        "not_before",
        "id",
        postgresql_where=text(_OPEN_WAIT),
        sqlite_where=text(_OPEN_WAIT),
    ),
    # Serves the approvals' escalation (store.approvals.overdue): the approvals not yet overdue.
    Index(
        "ix_steps_escalations",
        "escalate_at",
        postgresql_where=text("escalate_at IS NOT NULL"),
        sqlite_where=text("escalate_at IS NOT NULL"),
    ),
    # Serves the budgeted claim (flow limits): one agent's ready steps in claim order, so a
    # rate-limited agent's claim does not walk the other agents' backlogs.
    Index(
        "ix_steps_ready_agent",
        "agent",
        text("priority DESC"),
        "not_before",
        "id",
        postgresql_where=text("state = 'pending'"),
        sqlite_where=text("state = 'pending'"),
    ),
    # Serves the parked runs (store.operator.parking, `runs list --parked`): only parked steps.
    Index(
        "ix_steps_parked",
        "run_id",
        postgresql_where=text("state = 'parked'"),
        sqlite_where=text("state = 'parked'"),
    ),
    # Serves draining a map (store.runs.map_drain): its items by state, the waiting ones in
    # index order; only items of maps are in it.
    Index(
        "ix_steps_map_items",
        "map_parent",
        "state",
        "map_index",
        postgresql_where=text("map_parent IS NOT NULL"),
        sqlite_where=text("map_parent IS NOT NULL"),
    ),
    # Serves the supervisor sweep: only in-flight steps, by deadline.
    Index(
        "ix_steps_expiry",
        "complete_by",
        postgresql_where=text("state = 'processing'"),
        sqlite_where=text("state = 'processing'"),
    ),
)

events = Table(
    "events",
    metadata,
    Column("id", Id, Identity(), primary_key=True),
    # NULL for fleet events (entity "agent"): they belong to no run.
    Column("run_id", Id, ForeignKey("runs.id", ondelete="CASCADE"), nullable=True),
    Column("step_id", Id, nullable=True),
    Column("entity", String(10), nullable=False),
    Column("step", String(100), nullable=True),
    Column("from_state", String(20), nullable=True),
    Column("to_state", String(20), nullable=False),
    Column("attempt", Integer, nullable=True),
    Column("actor", String(200), nullable=False),
    Column("reason", Text, nullable=True),
    Column("detail", Json, nullable=True),
    Column("published", Boolean, nullable=False, server_default=false()),
    _ts("created_at", nullable=False, default_now=True),
    Index("ix_events_run_id_id", "run_id", "id"),
    # Serves the notification relay (the outbox): only events not yet published.
    Index(
        "ix_events_unpublished",
        "id",
        postgresql_where=text("NOT published"),
        sqlite_where=text("NOT published"),
    ),
    # Serves the relay's `first_unpublished` of a run (queries.unpublished_events): one probe,
    # where ix_events_run_id_id walks every published event of the run first (a map's run has
    # thousands).
    Index(
        "ix_events_run_unpublished",
        "run_id",
        "id",
        postgresql_where=text("NOT published"),
        sqlite_where=text("NOT published"),
    ),
)

incidents = Table(
    "incidents",
    metadata,
    # Alerts of one cause while it is open (store/outbox/incidents.py, docs/alerts.md#incidents):
    # how many, first and last seen; closed (acknowledged) by an operator or when its last open
    # alert is.
    Column("id", Id, Identity(), primary_key=True),
    Column("kind", String(50), nullable=False),
    Column("cause_key", String(64), nullable=False),
    Column("cause", Text, nullable=False),
    Column("workflow", String(100), nullable=True),
    Column("alert_count", Integer, nullable=False, server_default=text("1")),
    _ts("first_seen", nullable=False, default_now=True),
    _ts("last_seen", nullable=False, default_now=True),
    Column("acknowledged", Boolean, nullable=False, server_default=false()),
    Column("acknowledged_by", String(200), nullable=True),
    Column("acknowledge_reason", Text, nullable=True),
    _ts("acknowledged_at"),
    # When its last "still happening" notice was queued (store/outbox/incidents.py).
    _ts("reminded_at"),
    # One open incident per cause: the upsert of raise_alert counts into it.
    Index(
        "uq_incidents_open_cause_key",
        "cause_key",
        unique=True,
        postgresql_where=text("NOT acknowledged"),
        sqlite_where=text("NOT acknowledged"),
    ),
)

alerts = Table(
    "alerts",
    metadata,
    Column("id", Id, Identity(), primary_key=True),
    Column("run_id", Id, ForeignKey("runs.id", ondelete="CASCADE"), nullable=True),
    Column("step_id", Id, nullable=True),
    Column("kind", String(50), nullable=False),
    Column("dedup_key", String(200), nullable=False),
    Column("message", Text, nullable=False),
    Column("detail", Json, nullable=True),
    Column("acknowledged", Boolean, nullable=False, server_default=false()),
    Column("acknowledged_by", String(200), nullable=True),
    Column("acknowledge_reason", Text, nullable=True),
    _ts("acknowledged_at"),
    Column("incident_id", Id, ForeignKey("incidents.id", ondelete="SET NULL"), nullable=True),
    # Delivery: the sinks that took the alert, attempts so far, each failing sink's last
    # error, when the failed sinks are tried again; `notified_at` once every sink took it or
    # its delivery was given up (supervisor/dispatch.py).
    Column("delivered_to", Json, nullable=True),
    Column("delivery_attempts", Integer, nullable=False, server_default=text("0")),
    Column("delivery_errors", Json, nullable=True),
    _ts("retry_at"),
    _ts("notified_at"),
    _ts("created_at", nullable=False, default_now=True),
    # Serves the alert dispatcher (the sinks' outbox): only alerts not yet sent.
    Index(
        "ix_alerts_unnotified",
        "id",
        postgresql_where=text("notified_at IS NULL"),
        sqlite_where=text("notified_at IS NULL"),
    ),
    # Serves the cascade when retention deletes runs (one lookup per deleted run instead of a
    # scan of alerts) and retention's "no open alert" test.
    Index("ix_alerts_run_id", "run_id"),
    # Serves an incident's alerts (its page, its acknowledgement, whether any is still open).
    Index("ix_alerts_incident_id", "incident_id"),
    # Serves "was this subject alerted since T" (an agent outage an operator acknowledged is
    # not raised again while it lasts: supervisor.outage).
    Index("ix_alerts_dedup_key_created_at", "dedup_key", "created_at"),
    # One open alert per step and kind.
    Index(
        "uq_alerts_open_dedup_key",
        "dedup_key",
        unique=True,
        postgresql_where=text("NOT acknowledged"),
        sqlite_where=text("NOT acknowledged"),
    ),
)

leases = Table(
    "leases",
    metadata,
    # One row per singleton role (the supervisor): who holds it, until when, and a fencing
    # token that grows with every change of holder.
    Column("name", String(100), primary_key=True),
    Column("holder", String(100), nullable=False),
    Column("token", BigInteger, nullable=False),
    _ts("acquired_at", nullable=False, default_now=True),
    _ts("expires_at", nullable=False),
)

retention_marks = Table(
    "retention_marks",
    metadata,
    # When the supervisor's retention next needs to look at what it cannot query by age (the
    # head of <ns>.dead: a message is read by taking it, and every hand-back counts towards a
    # quorum queue's delivery limit). Kept on the database clock, so a supervisor run from cron
    # does not take it on every run.
    Column("name", String(200), primary_key=True),
    _ts("due_at", nullable=False),
)

schedulers = Table(
    "schedulers",
    metadata,
    Column("id", String(100), primary_key=True),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("draining", Boolean, nullable=False, server_default=false()),
    Column("claimed", BigInteger, nullable=False, server_default=text("0")),
    Column("applied", BigInteger, nullable=False, server_default=text("0")),
    _ts("started_at", nullable=False, default_now=True),
    _ts("heartbeat_at", nullable=False, default_now=True),
    # The registry of the schedule cluster (docs/cluster.md): one row per registration (a new
    # id each time a scheduler registers), its name unique among the rows, its lease on the
    # database clock. A row whose lease expired is a dead scheduler.
    Column("name", String(100), nullable=False, server_default=text("''")),
    Column("address", String(255), nullable=False, server_default=text("''")),
    Column("fault_tolerance", Integer, nullable=False, server_default=text("1")),
    Column("alarm_threshold", Integer, nullable=True),
    Column("held", Integer, nullable=False, server_default=text("0")),
    Column("lease_ttl_s", Float, nullable=False, server_default=text("10")),
    _ts("lease_expires_at", nullable=False, default_now=True),
    # The assignment strategy it runs (`--assignment`): the whole cluster runs one.
    Column("assignment", String(20), nullable=False, server_default=text("'acquire'")),
    # The workflow versions it has loaded: a JSON list of [name, version] (NULL: an older
    # scheduler that does not say).
    Column("workflows", Json, nullable=True),
    # Serves S (live schedulers) and the "is the owner alive" test of the acquisition.
    Index("ix_schedulers_lease_expires_at", "lease_expires_at"),
    Index("ix_schedulers_name", "name"),
)

scheduler_offline = Table(
    "scheduler_offline",
    metadata,
    # The offline (drain) list, keyed by scheduler NAME so that it outlives a registration: a
    # drained scheduler that restarts stays drained until `sasflow schedulers undrain`.
    Column("name", String(100), primary_key=True),
    Column("actor", String(200), nullable=False),
    Column("reason", Text, nullable=True),
    _ts("since", nullable=False, default_now=True),
)

schedules = Table(
    "schedules",
    metadata,
    Column("id", Id, Identity(), primary_key=True),
    Column("name", String(100), nullable=False, unique=True),
    Column("workflow", String(100), nullable=False),
    Column("input", Json, nullable=False),
    Column("cron", String(200), nullable=True),
    Column("interval_s", Float, nullable=True),
    Column("timezone", String(64), nullable=False, server_default=text("'UTC'")),
    Column("catch_up", String(10), nullable=False, server_default=text("'latest'")),
    Column("max_catch_up", Integer, nullable=False, server_default=text("10")),
    Column("source", String(10), nullable=False, server_default=text("'cli'")),
    Column("paused", Boolean, nullable=False, server_default=false()),
    # The registration (schedulers.id) holding it, and since when (database clock): ticks
    # that fell due before `acquired_at` were missed, and the catch-up policy applies.
    Column("owner", String(100), nullable=True),
    _ts("acquired_at"),
    _ts("next_tick_at", nullable=False),
    _ts("last_tick_at"),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    # Serves each scheduler's "my due schedules" scan and its X count.
    Index("ix_schedules_owner_next_tick_at", "owner", "next_tick_at"),
)

shard_plan = Table(
    "shard_plan",
    metadata,
    # The scope strategy's plan (docs/cluster.md): one row per plan kind ("scope"). `epoch`
    # grows at every reshard; `ready` is false while the leader writes the epoch's ranges (no
    # scheduler fires then). Written by the holder of the shard-leader lease only.
    Column("name", String(20), primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    Column("ready", Boolean, nullable=False, server_default=false()),
    Column("leader", String(100), nullable=False),
    Column("leader_name", String(100), nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("active", Integer, nullable=False, server_default=text("0")),
    Column("live", Integer, nullable=False, server_default=text("0")),
    _ts("changed_at", nullable=False, default_now=True),
)

shard_ranges = Table(
    "shard_ranges",
    metadata,
    # One row per scheduler (by name: a scheduler registering again keeps its range) in a
    # plan epoch: its registration when planned, its positions first..last among the active
    # schedules ordered by id (empty when last < first), and the schedule ids it covers,
    # lo_id..hi_id (NULL: unbounded), contiguous over the epoch's rows.
    Column("epoch", BigInteger, primary_key=True),
    Column("name", String(100), primary_key=True),
    Column("scheduler_id", String(100), nullable=False),
    Column("position", Integer, nullable=False),
    Column("address", String(255), nullable=False),
    Column("first", Integer, nullable=False),
    Column("last", Integer, nullable=False),
    Column("lo_id", Id, nullable=True),
    Column("hi_id", Id, nullable=True),
)

schedule_ticks = Table(
    "schedule_ticks",
    metadata,
    # Each tick fired (one row per schedule and tick time: a tick fired twice is recorded
    # once, and its run is one run, by its business key).
    Column("id", Id, Identity(), primary_key=True),
    Column("schedule_id", Id, ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False),
    _ts("tick_at", nullable=False),
    Column("run_id", Id, nullable=True),
    Column("fired_by", String(200), nullable=False),
    Column("error", Text, nullable=True),
    _ts("fired_at", nullable=False, default_now=True),
    UniqueConstraint("schedule_id", "tick_at"),
)

audit = Table(
    "audit",
    metadata,
    # Operator and retention actions that have no run to hang an event on: dead letters
    # (they live in RabbitMQ) and pruned runs (their events go with them).
    Column("id", Id, Identity(), primary_key=True),
    Column("actor", String(200), nullable=False),
    Column("action", String(50), nullable=False),
    Column("reason", Text, nullable=True),
    Column("detail", Json, nullable=True),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    # Serves `sasflow audit list --since` and the retention of audit rows (oldest first).
    Index("ix_audit_created_at", "created_at"),
)

agent_instances = Table(
    "agent_instances",
    metadata,
    # The fleet view: one row per agent process, written from its heartbeats (which reach the
    # database through a scheduler: agents have no database access).
    Column("instance_id", String(100), primary_key=True),
    Column("agent", String(100), nullable=False),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", String(50), nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("in_flight", Integer, nullable=False),
    Column("breakers", Json, nullable=False),
    Column("interval_s", Float, nullable=False),
    # The instance's heartbeat counter: a heartbeat older than the one recorded (another
    # scheduler took it later) changes nothing, so a goodbye is never undone by a late beat.
    Column("seq", BigInteger, nullable=False, server_default=text("0")),
    Column("state", String(20), nullable=False),
    # What the instance's handlers call: action -> the dependency (breaker) it names, or null
    # (NULL: an agent too old to say). Resolves the flow limits set on a dependency.
    Column("actions", Json, nullable=True),
    # Seconds, as of `heartbeat_at`, until each open breaker lets a trial call through.
    Column("breakers_open_for", Json, nullable=True),
    # Worker threads held by handlers past their deadline; equal to `concurrency`: wedged.
    Column("held", Integer, nullable=False, server_default=text("0")),
    _ts("first_seen_at", nullable=False, default_now=True),
    _ts("heartbeat_at", nullable=False, default_now=True),
    _ts("gone_at"),
    # Serves the supervisor's loss detection: only live instances, by last heartbeat.
    Index(
        "ix_agent_instances_live",
        "heartbeat_at",
        postgresql_where=text("state = 'live'"),
        sqlite_where=text("state = 'live'"),
    ),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    # Bearer tokens of the HTTP API: only the SHA-256 of the secret is stored.
    Column("id", Id, Identity(), primary_key=True),
    Column("name", String(100), nullable=False),
    Column("token_hash", String(64), nullable=False),
    Column("scopes", Json, nullable=False),
    Column("created_by", String(200), nullable=False),
    _ts("created_at", nullable=False, default_now=True),
    _ts("revoked_at"),
    # Serves authentication: one lookup per request.
    UniqueConstraint("token_hash"),
    # One live token per name (a revoked name may be reused).
    Index(
        "uq_api_tokens_live_name",
        "name",
        unique=True,
        postgresql_where=text("revoked_at IS NULL"),
        sqlite_where=text("revoked_at IS NULL"),
    ),
)

callbacks = Table(
    "callbacks",
    metadata,
    # The HTTP callbacks outbox: one row per run that ended with a callback_url, written in
    # the transaction that made it terminal, delivered by the API servers' callback loop.
    Column("id", Id, Identity(), primary_key=True),
    Column("run_id", Id, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("url", String(2000), nullable=False),
    Column("idempotency_key", String(100), nullable=False),
    Column("payload", Json, nullable=False),
    Column("state", String(20), nullable=False, server_default=text("'pending'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("last_error", Text, nullable=True),
    _ts("next_attempt_at", nullable=False, default_now=True),
    _ts("delivered_at"),
    _ts("created_at", nullable=False, default_now=True),
    UniqueConstraint("idempotency_key"),
    Index("ix_callbacks_run_id", "run_id"),
    # Serves the delivery loop: only callbacks still to deliver, by due time.
    Index(
        "ix_callbacks_due",
        "next_attempt_at",
        postgresql_where=text("state = 'pending'"),
        sqlite_where=text("state = 'pending'"),
    ),
)

subscribers = Table(
    "subscribers",
    metadata,
    # The subscription stream's durable side (engine/api/stream): who subscribed with which
    # filter, and which stream is its current one, so any API server can serve or end it.
    Column("id", String(36), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("owner", String(200), nullable=False),
    Column("workflows", Json, nullable=True),
    Column("submitted_by", String(200), nullable=True),
    Column("stream_id", String(36), nullable=True, unique=True),
    _ts("created_at", nullable=False, default_now=True),
    _ts("connected_at", nullable=False, default_now=True),
    # When a stream of it was last known open (refreshed at each of its heartbeats); NULL:
    # not since it connected. A subscriber away too long is alerted, then expired (supervisor):
    # from `expired_at` on it receives nothing and cannot reconnect, while its updates are
    # deleted in batches, then its row.
    _ts("seen_at"),
    _ts("expired_at"),
)

stream_updates = Table(
    "stream_updates",
    metadata,
    # One row per update a subscriber has not acknowledged yet (deleted by ACKNOWLEDGE), and
    # per RECONCILE answer not yet sent (`uuid` NULL: deleted once sent). Written by the relay
    # in the transaction that publishes the event. No foreign key to runs or events: retention
    # may prune a run whose last updates are still unacknowledged.
    Column("id", Id, Identity(), primary_key=True),
    Column(
        "subscriber_id",
        String(36),
        ForeignKey("subscribers.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("uuid", String(36), nullable=True, unique=True),
    Column("run_id", Id, nullable=True),  # NULL: a FAILURE (an agent instance lost)
    Column("body", Json, nullable=False),
    Column("sent_stream", String(36), nullable=True),
    _ts("sent_at"),
    # Serves a stream's read of its subscriber's due updates, in commit order.
    Index("ix_stream_updates_subscriber_id_id", "subscriber_id", "id"),
)

flow_limits = Table(
    "flow_limits",
    metadata,
    # Rate and concurrency limits evaluated by the claim (docs/flow-control.md): which steps
    # (an agent's, all or some of its actions, or those using a dependency), one budget or one
    # per key (an expression of the run), calls started per second with a burst, steps at once.
    Column("name", String(100), primary_key=True),
    Column("agent", String(100), nullable=False),
    Column("actions", Json, nullable=True),
    Column("dependency", String(100), nullable=True),
    Column("key", String(200), nullable=True),
    Column("rate", Float, nullable=True),
    Column("burst", Integer, nullable=True),
    Column("concurrency", Integer, nullable=True),
    Column("enabled", Boolean, nullable=False, server_default=true()),
    # When a claim last admitted a step under it (written by that claim).
    _ts("last_admitted_at"),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    Column("updated_by", String(200), nullable=False),
    Column("reason", Text, nullable=True),
    # Serves the claim's lock of the limits of the agents it claims for.
    Index("ix_flow_limits_agent", "agent"),
)

agent_pauses = Table(
    "agent_pauses",
    metadata,
    # An agent (action '') or one of its actions paused by an operator (ops/pause.py): the
    # schedulers' flow plan reads these rows, and the claim takes none of their steps; the steps
    # stay pending with their deadlines not started.
    Column("agent", String(100), primary_key=True),
    Column("action", String(100), primary_key=True),
    Column("paused_by", String(200), nullable=False),
    Column("reason", Text, nullable=False),
    _ts("paused_at", nullable=False, default_now=True),
)

flow_buckets = Table(
    "flow_buckets",
    metadata,
    # The rate of a limit, per key ('' when the limit has no key): GCRA's theoretical arrival
    # time. A row whose `tat` is past holds a full burst, as a missing row does.
    Column(
        "limit_name",
        String(100),
        ForeignKey("flow_limits.name", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("key", String(200), primary_key=True),
    _ts("tat", nullable=False),
)

workflow_versions = Table(
    "workflow_versions",
    metadata,
    # The fingerprint of each workflow version as first registered (sasflow.fingerprint): a
    # process loading the same (workflow, version) with another definition is refused at start.
    Column("workflow", String(100), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("fingerprint", String(64), nullable=False),
    _ts("registered_at", nullable=False, default_now=True),
    Column("registered_by", String(200), nullable=False),
)

_UNMATCHED = "consumed_at IS NULL"

inbound_events = Table(
    "inbound_events",
    metadata,
    # Events sent to event waits (Step.wait_for), stored first and matched both ways
    # (store.inbound): an event before its wait waits here until the wait opens, or until
    # `expires_at`, when it is deleted; a consumed one is deleted with its run
    # (store.operator.retention), its id deduplicated until then.
    Column("id", Id, Identity(), primary_key=True),
    Column("name", String(100), nullable=False),
    # The sender's id: a second event with the same name and id is the same event.
    Column("event_id", String(200), nullable=False),
    Column("correlation", String(200), nullable=False),
    Column("payload", Json, nullable=True),
    Column("source", String(20), nullable=False),
    _ts("received_at", nullable=False, default_now=True),
    _ts("expires_at", nullable=False),
    Column("consumed_step_id", Id, ForeignKey("steps.id", ondelete="SET NULL"), nullable=True),
    _ts("consumed_at"),
    UniqueConstraint("name", "event_id"),
    # Serves matching a wait that opens: unmatched events by name and correlation, oldest first.
    Index(
        "ix_inbound_events_unmatched",
        "name",
        "correlation",
        "received_at",
        postgresql_where=text(_UNMATCHED),
        sqlite_where=text(_UNMATCHED),
    ),
    # Serves the expiry of unmatched events.
    Index(
        "ix_inbound_events_expiry",
        "expires_at",
        postgresql_where=text(_UNMATCHED),
        sqlite_where=text(_UNMATCHED),
    ),
    # One event per wait, whatever races: the database refuses a second.
    Index(
        "ux_inbound_events_step",
        "consumed_step_id",
        unique=True,
        postgresql_where=text("consumed_step_id IS NOT NULL"),
        sqlite_where=text("consumed_step_id IS NOT NULL"),
    ),
)
