"""The response bodies of the REST API (pydantic): what OpenAPI shows. Request bodies are in
`models.py`; each response model is named `...Response`.

The service functions return dicts (rows of the store); FastAPI validates them against these
models on the way out. Extra keys pass through (`extra="allow"`), so a column added to the
store shows up without losing anything until its field is named here. A model of a row names
its fields in the order of the row's columns: the JSON keeps the store's key order (named
fields come first, extra keys after them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- runs ------------------------------------------------------------------------------------


class RunResponse(_Response):
    """A run: every column of its row (`GET /v1/runs/{id}`, a submission's `run`)."""

    id: int
    workflow: str
    version: int
    business_key: str
    input: Any
    priority: int
    state: str = Field(description="pending, running, completed, error, compensating, ...")
    reply_to: str | None
    submitted_by: str | None = Field(description="The name of the token that submitted it.")
    callback_url: str | None
    pool: str | None
    trace_parent: str | None
    on_failure: str
    deadline_at: datetime | None = Field(
        default=None, description="When its workflow's deadline passes (docs/timeouts.md)."
    )
    on_deadline: str | None = Field(default=None, description="alert, cancel or compensate.")
    deadline_fired_at: datetime | None = Field(
        default=None, description="When the supervisor acted on the passed deadline."
    )
    output: Any
    error: Any
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    paused: bool = Field(
        default=False, description="Paused by an operator: none of its steps is dispatched."
    )
    parent_run_id: int | None = Field(
        default=None,
        description='The run whose child step started it (docs/concepts.md, "Child '
        'workflows"); null for a run submitted otherwise.',
    )
    parent_step: str | None = Field(
        default=None, description="The parent's child step that started it."
    )
    parked: list[str] = Field(
        default_factory=list,
        description="Its parked steps (their failures ran out and their policy parks them): the "
        "run waits for an operator to unpark or fail it (docs/operations.md).",
    )
    children: list[int] = Field(
        default_factory=list,
        description="The runs its child steps started, oldest first (`GET /v1/runs/{id}`).",
    )


class RunSummaryResponse(_Response):
    """A run as `GET /v1/runs` lists it (no input or output)."""

    id: int
    workflow: str
    version: int
    business_key: str
    state: str
    priority: int
    submitted_by: str | None
    pool: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    error: Any
    parked: bool = Field(default=False, description="It has a parked step.")


class StepResponse(_Response):
    """A step of a run: forward steps, then compensation steps."""

    id: int
    name: str
    kind: str = Field(description="forward or compensation.")
    agent: str
    action: str
    state: str
    attempt: int
    failure_count: int
    max_failures: int
    locked_by: str | None
    complete_by: datetime | None
    started_at: datetime | None = Field(
        default=None,
        description="When an agent said it started this attempt (null: not yet, or not "
        "processing); complete_by is then its execution deadline, before it the envelope.",
    )
    wait_expiries: int = Field(
        default=0, description="Requests in a row no agent took within the wait timeout."
    )
    not_before: datetime
    error: Any = Field(
        description="Its last error (docs/protocol.md 7.3): `type` and `message`, and the "
        "handler's `traceback` (its last 4 KiB) when a Python agent's handler raised it; null "
        "once it succeeds."
    )
    input: Any
    output: Any
    idempotency_key: str
    map_parent: int | None = Field(
        default=None, description="An item of a map step: its map's step id (null otherwise)."
    )
    map_index: int | None = Field(
        default=None, description="An item of a map step: its index (null otherwise)."
    )
    waiting: str | None = Field(
        default=None,
        description="What a pending step waits for: a backoff, a flow limit (`rate-limited: "
        "payments 100/s`), a breaker, no live agent instance (docs/flow-control.md); null when "
        "it is not held.",
    )
    skipped: str | None = Field(
        default=None,
        description="Why a skipped step was skipped: `run failed`, `dependencies skipped: "
        "refund`, or `condition false: steps.charge.captured == True; read "
        "steps.charge.captured=false` (docs/concepts.md, Conditions); null otherwise.",
    )
    map: MapResponse | None = Field(
        default=None,
        description="A map step whose items exist: its items grouped under it (null for other "
        "steps, and for a map not started); the items are not in the run's `steps`.",
    )


class MapResponse(_Response):
    """A map step's items (docs/concepts.md, Map steps): how many in each state, the first ones."""

    size: int = Field(description="How many items the map has.")
    parallelism: int | None
    on_item_failure: str | None
    counts: dict[str, int] = Field(description="How many items are in each state.")
    items: list[StepResponse] = Field(
        description="The first items in index order (`map_items` of `GET /v1/runs/{id}`, 20 "
        "unless asked)."
    )
    more: int = Field(description="How many items are not listed.")


class EventResponse(_Response):
    """A state change of a run or one of its steps (`entity`), with who made it and why."""

    id: int
    created_at: datetime
    entity: str
    step_id: int | None
    step: str | None
    from_state: str | None
    to_state: str
    attempt: int | None
    actor: str
    reason: str | None
    detail: Any


class FailureResponse(_Response):
    """An attempt that did not succeed (from the events: a resubmission keeps them)."""

    at: datetime
    step: str | None
    step_id: int | None
    attempt: int | None
    outcome: str | None = Field(description="`error`, `expired`, `deferred`...")
    to_state: str
    error: Any = Field(
        description="The agent's error when it replied one (with the handler's `traceback` when "
        "it kept one)."
    )
    by: str


class RunDetailResponse(_Response):
    run: RunResponse
    steps: list[StepResponse]
    events: list[EventResponse] = Field(description="The last 50 events, oldest first.")
    failures: list[FailureResponse] = Field(
        description="Every attempt that did not succeed, oldest first, across resubmissions."
    )


class SubmittedResponse(_Response):
    id: int
    created: bool = Field(description="False when the key was known: the run it maps to.")
    input_differs: bool = Field(
        default=False,
        description="True when the key names a run recorded with another input: that run is "
        "kept as it is and this request's input was not used (submit it with another key).",
    )
    message: str | None = Field(
        default=None, description="When `input_differs`: what it means, for people."
    )
    run: RunResponse


class BatchItemResponse(_Response):
    """One run of a batch: created, the existing run of its key, or refused and why."""

    index: int = Field(description="Its place in the request's `runs`, from 0.")
    status: Literal["created", "duplicate", "refused"]
    id: int | None = Field(default=None, description="The run (null when refused).")
    key: str | None = Field(default=None, description="Its business key (null when refused).")
    input_differs: bool = Field(
        default=False, description="As `POST /v1/runs` says it for a duplicate."
    )
    error: Literal["invalid_input", "unknown_workflow", "backlog_full"] | None = Field(
        default=None, description="Why it was refused (the code `POST /v1/runs` would answer)."
    )
    message: str | None = Field(
        default=None, description="For people: why it was refused, or what `input_differs` means."
    )
    retry_after: int | None = Field(
        default=None, description="`backlog_full`: seconds to wait before submitting it again."
    )


class BatchSubmittedResponse(_Response):
    runs: list[BatchItemResponse] = Field(description="One answer per run, in the request's order.")
    created: int
    duplicates: int
    refused: int


class BacklogFullResponse(_Response):
    """429 of `POST /v1/runs`: the workflow's backlog is at its bound (docs/backpressure.md)."""

    error: Literal["backlog_full"]
    message: str
    workflow: str
    backlog: int = Field(
        description="Runs of the workflow waiting to start, counted up to the bound (so at "
        "least this many)."
    )
    max_backlog: int = Field(description="The bound: the workflow's own, else the server's.")
    retry_after: int = Field(description="Seconds to wait, as the `Retry-After` header says.")


class RunListResponse(_Response):
    runs: list[RunSummaryResponse] = Field(description="Newest first.")
    next_cursor: int | None = Field(description="The `cursor` of the next page; null on the last.")


class CancelledResponse(_Response):
    id: int
    state: str = Field(description="The run's state afterwards.")
    cancelled_steps: list[str]


class ResubmittedResponse(_Response):
    id: int
    reset_steps: list[str]
    ready_steps: list[str]


# -- alerts ----------------------------------------------------------------------------------


class AlertSummaryResponse(_Response):
    """An alert as `GET /v1/alerts` lists it (`sasflow alerts list`)."""

    id: int
    kind: str
    run_id: int | None
    step_id: int | None
    message: str
    acknowledged: bool
    acknowledged_by: str | None
    created_at: datetime
    notified_at: datetime | None
    delivery_errors: dict[str, str] | None = Field(
        default=None, description="Each sink that failed to take it the last time, with its error."
    )
    retry_at: datetime | None = Field(
        default=None,
        description="When the failed sinks are tried again; null with delivery_errors: given up.",
    )
    incident_id: int | None = Field(
        default=None, description="The incident it belongs to (`GET /v1/incidents/{id}`)."
    )


class AlertResponse(_Response):
    """An alert: every column of its row."""

    id: int
    run_id: int | None
    step_id: int | None
    kind: str
    dedup_key: str
    message: str
    detail: Any
    acknowledged: bool
    acknowledged_by: str | None
    acknowledge_reason: str | None
    acknowledged_at: datetime | None
    incident_id: int | None = Field(
        default=None, description="The incident it belongs to (`GET /v1/incidents/{id}`)."
    )
    delivered_to: list[str] | None = Field(
        default=None, description="The sinks that took the alert (by name)."
    )
    delivery_attempts: int = Field(default=0, description="Dispatches that handled it so far.")
    delivery_errors: dict[str, str] | None = Field(
        default=None, description="Each sink that failed the last time, with its error."
    )
    retry_at: datetime | None = Field(
        default=None, description="When the failed sinks are tried again."
    )
    notified_at: datetime | None = Field(
        description="When every sink had taken it, or its delivery was given up (then "
        "`delivery_errors` names the sinks that never took it)."
    )
    created_at: datetime


class AlertListResponse(_Response):
    alerts: list[AlertSummaryResponse] = Field(description="Newest first.")


# -- incidents -------------------------------------------------------------------------------


class IncidentSummaryResponse(_Response):
    """Alerts of one cause while it lasts (`sasflow alerts incidents`, docs/alerts.md)."""

    id: int
    kind: str
    cause: str = Field(description="What groups its alerts, readable (numbers, ids stripped).")
    workflow: str | None
    alert_count: int = Field(description="How many alerts it counted.")
    first_seen: datetime
    last_seen: datetime
    acknowledged: bool = Field(
        description="Closed: acknowledged by an operator, or its last open alert was."
    )
    acknowledged_by: str | None
    acknowledge_reason: str | None
    acknowledged_at: datetime | None
    sample_runs: list[int] = Field(
        default_factory=list, description="Up to 5 of its runs, the first alerted first."
    )


class IncidentListResponse(_Response):
    incidents: list[IncidentSummaryResponse] = Field(description="The last seen first.")


class IncidentAlertResponse(_Response):
    """One alert of an incident, with its run's workflow, business key and state."""

    id: int
    kind: str
    run_id: int | None
    step_id: int | None
    message: str
    acknowledged: bool
    acknowledged_by: str | None
    created_at: datetime
    notified_at: datetime | None
    workflow: str | None
    business_key: str | None
    run_state: str | None


class _IncidentFacts(_Response):
    """What every answer about an incident says of it."""

    id: int
    kind: str
    cause: str
    workflow: str | None
    alert_count: int
    first_seen: datetime
    last_seen: datetime
    acknowledged: bool
    acknowledged_by: str | None
    acknowledge_reason: str | None
    acknowledged_at: datetime | None


class IncidentResponse(_IncidentFacts):
    """An incident, how many of its alerts are open (what acknowledging it would acknowledge)
    and its alerts (its resolved notice among them once closed)."""

    open_alerts: int = Field(description="Its alerts not acknowledged yet.")
    alerts: list[IncidentAlertResponse] = Field(
        description="The first raised first (1,000 at most)."
    )


class IncidentAckResponse(_IncidentFacts):
    """An incident just acknowledged, with how many of its alerts that acknowledged."""

    alerts_acknowledged: int = Field(description="The open alerts it acknowledged.")


# -- schedules -------------------------------------------------------------------------------


class TickResponse(_Response):
    """One fired tick: the run it submitted, or the error that kept it from running."""

    schedule_id: int
    tick_at: datetime
    run_id: int | None
    fired_by: str
    fired_at: datetime
    error: str | None


class ScheduleResponse(_Response):
    """A schedule, its owner (the registration holding it) and its next tick."""

    id: int
    name: str
    workflow: str
    input: Any
    cron: str | None
    interval_s: float | None
    timezone: str
    catch_up: str
    max_catch_up: int
    source: str
    paused: bool
    owner: str | None
    owner_name: str | None = Field(default=None, description="The owner's scheduler name.")
    owner_live: bool | None = Field(default=None, description="Whether its lease holds.")
    next_tick_at: datetime
    last_tick_at: datetime | None


class ScheduleListResponse(_Response):
    schedules: list[ScheduleResponse]


class ScheduleDetailResponse(ScheduleResponse):
    timing: str = Field(description="The timing as people read it, e.g. `every 300s`.")
    ticks: list[TickResponse] = Field(description="The last ticks, newest first.")


class TriggeredResponse(_Response):
    schedule_id: int
    name: str
    tick_at: datetime
    run_id: int | None = Field(description="Null when the run could not be submitted.")
    tick: TickResponse | None


# -- the scheduler cluster and the agent fleet -----------------------------------------------


class SchedulerResponse(_Response):
    """A scheduler as `sasflow schedulers list` shows it (docs/cluster.md names K..M)."""

    name: str
    address: str | None
    state: str = Field(description="online, draining, drained or dead.")
    K: int = Field(description="Active schedules.")
    S: int = Field(description="Live schedulers.")
    N: int | None = Field(description="Its share (the size of its range under scope).")
    X: int = Field(description="Schedules it holds.")
    M: int | None = Field(description="Its alarm threshold.")
    lease_age_s: float | None
    lease_ttl_s: float | None
    leader: bool
    epoch: int | None
    range: str | None


class SchedulerChangedResponse(_Response):
    name: str
    scheduler: SchedulerResponse | None = Field(
        description="It as the cluster view shows it afterwards; null when no registration "
        "and no offline entry is left of that name."
    )


class SchedulerListResponse(_Response):
    schedulers: list[SchedulerResponse]
    plan: dict[str, Any] = Field(description="The scope plan (`state` none under acquire).")


class AgentResponse(_Response):
    """An agent instance of the fleet registry."""

    instance_id: str
    agent: str
    hostname: str
    pid: int
    version: str
    state: str = Field(description="live, lost or stopped.")
    concurrency: int
    in_flight: int
    held: int = Field(
        0, description="Worker threads held by handlers running past their step's deadline."
    )
    wedged: bool = Field(
        False,
        description="Live, with every worker thread held past deadline: it takes no "
        "requests (docs/agents.md, wedged agents).",
    )
    breakers: dict[str, Any] = Field(description="Circuit breaker states by name.")
    heartbeat_at: datetime
    seconds_since_heartbeat: float


class AgentPauseResponse(_Response):
    """A paused agent (`action` null) or action."""

    agent: str
    action: str | None
    paused_by: str
    reason: str
    paused_at: datetime


class AgentListResponse(_Response):
    agents: list[AgentResponse]
    paused: list[AgentPauseResponse] = Field(
        default_factory=list, description="The paused agents and actions."
    )


class RunPausedResponse(_Response):
    id: int
    state: str = Field(description="The run's state (a pause does not change it).")
    paused: bool
    changed: bool = Field(description="False: it already was paused (or not paused).")


class RunParkResponse(_Response):
    """What unparking or failing a run did."""

    id: int
    state: str = Field(description="The run's state after it (unpark leaves it as it was).")
    steps: list[str] = Field(description="The steps unparked or failed.")
    changed: bool = Field(description="False: it had no parked step (unpark only).")


class AgentPausedResponse(_Response):
    agent: str
    action: str | None = Field(description="null: the whole agent.")
    paused: bool
    changed: bool = Field(description="False: it already was paused (or not paused).")


# -- flow limits ------------------------------------------------------------------------------


class LimitStateResponse(_Response):
    """A limit's live state (docs/flow-control.md)."""

    resolved: bool = Field(
        description="False: a dependency no live agent instance reports; it holds nothing."
    )
    actions: list[str] | None = Field(description="The actions it selects (null: every one).")
    in_flight: int = Field(description="Its steps in processing.")
    in_flight_keys: dict[str, int] = Field(description="The busiest keys and their steps.")
    tokens: float | None = Field(description="Steps its rate would start now (no key only).")
    ready: int = Field(description="Ready steps it selects (held while it has no room).")


class LimitResponse(_Response):
    """A flow limit: its row, as operators read it, and its live state."""

    name: str
    agent: str
    actions: list[str] | None
    dependency: str | None
    key: str | None
    rate: float | None = Field(description="Steps started per second.")
    burst: int | None
    concurrency: int | None
    enabled: bool
    last_admitted_at: datetime | None
    created_at: datetime
    updated_at: datetime
    updated_by: str
    reason: str | None
    description: str = Field(description="e.g. `100/s (burst 100), 40 at once`.")
    burst_effective: int | None
    state: LimitStateResponse
    created: bool | None = Field(default=None, description="PUT: whether it was new.")


class LimitListResponse(_Response):
    limits: list[LimitResponse]


class LimitDeletedResponse(_Response):
    name: str
    deleted: bool


# -- events ----------------------------------------------------------------------------------


class EventSentResponse(_Response):
    """An inbound event sent (`POST /v1/events`): stored now or before, and what it completed."""

    id: int = Field(description="The stored event's row id.")
    duplicate: bool = Field(description="The same (name, id) was stored before: unchanged.")
    matched: bool = Field(description="A wait consumed it (now or before).")
    step_id: int | None = Field(description="The wait step it completed, if any.")
    run_id: int | None = Field(description="That step's run.")


class InboundEventResponse(_Response):
    """A stored inbound event (`GET /v1/events`)."""

    id: int
    name: str
    event_id: str = Field(description="The sender's id of the event.")
    correlation: str
    payload: Any
    source: str = Field(description="`api`, `amqp` or `cli`.")
    received_at: datetime
    expires_at: datetime
    consumed_at: datetime | None
    step_id: int | None
    run_id: int | None
    step: str | None


class EventListResponse(_Response):
    events: list[InboundEventResponse] = Field(description="Newest first.")


class ApprovalResponse(_Response):
    """An open approval (`GET /v1/approvals`)."""

    run_id: int
    step: str
    workflow: str
    version: int
    business_key: str
    group: str = Field(description="The approvers' group: `approve` is the default group.")
    scope: str = Field(description="The scope deciding it needs: `approve` or `approve:<group>`.")
    form: dict[str, Any] = Field(
        description="Field -> `{type: str|int|float|bool|choice, required, choices?}`."
    )
    opened_at: datetime
    times_out_at: datetime | None
    escalate_at: datetime | None = Field(
        description="When it becomes overdue (`approval_overdue` alert); null: no escalation "
        "or already raised."
    )


class ApprovalListResponse(_Response):
    approvals: list[ApprovalResponse] = Field(description="Oldest first.")


class ApprovalDecisionResponse(_Response):
    """What a decision did."""

    run_id: int
    step: str
    decision: str = Field(description="`approved` or `rejected`.")
    by: str = Field(description="The token's name.")
    at: datetime = Field(description="The database's time of the decision.")
    step_state: str = Field(description="`processed`, or `error` / `parked` when rejected.")
    run_state: str = Field(description="The run's state after it advanced.")
