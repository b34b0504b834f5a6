"""The request bodies of the REST API (pydantic): what OpenAPI shows and FastAPI validates,
with the examples the document shows for each (`...EXAMPLES`, `Body(openapi_examples=...)`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AnyHttpUrl, AwareDatetime, BaseModel, ConfigDict, Field

from sasflow.api.validation import INT_MAX, Reason
from sasflow.store.flow.model import MAX_ACTIONS, MAX_COUNT, MAX_RATE
from sasflow.workflow import NAME_PATTERN, WORKFLOW_NAME_PATTERN

POOL_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunRequest(_Body):
    """Submit a run of `workflow`; idempotent on (workflow, key)."""

    workflow: str = Field(
        min_length=1, max_length=100, pattern=WORKFLOW_NAME_PATTERN.pattern, examples=["order"]
    )
    input: dict[str, Any] = Field(default_factory=dict, description="The run's input object.")
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Business key: the same key again returns the existing run (200).",
    )
    priority: int = Field(
        default=0, ge=-1000, le=1000, description="Higher runs' ready steps are claimed first."
    )
    version: int | None = Field(
        default=None, ge=1, le=INT_MAX, description="Workflow version [latest]."
    )
    callback_url: AnyHttpUrl | None = Field(
        default=None, description="POSTed the run's summary once it ends (signed, retried)."
    )
    pool: str | None = Field(
        default=None,
        pattern=POOL_PATTERN,
        description="Agent pool of its steps (`sasflow agent --pool NAME`), unless a step's "
        "definition names its own.",
    )
    start_at: AwareDatetime | None = Field(
        default=None,
        description="Start the run later: its first steps are not claimed before this time "
        "(ISO 8601 with an offset, the database clock decides); past or absent: at once.",
    )


MAX_BATCH = 1000
"""Runs one `POST /v1/runs/batch` may submit (the body limit, api_max_body_bytes, applies too)."""


class BatchRequest(_Body):
    """Submit many runs in one transaction; each item as the body of `POST /v1/runs`."""

    runs: list[RunRequest] = Field(
        min_length=1, max_length=MAX_BATCH, description=f"1 to {MAX_BATCH} runs, in order."
    )


class CancelRequest(_Body):
    reason: Reason
    compensate: bool = Field(default=False, description="Undo the processed steps.")


class ResubmitRequest(_Body):
    reason: Reason
    from_step: str | None = Field(default=None, min_length=1, max_length=100)
    input: dict[str, Any] | None = Field(default=None, description="A corrected run input.")


class AcknowledgeRequest(_Body):
    reason: Reason


class ApproveRequest(_Body):
    """An approval's approval: its form's fields (validated against the form) and a comment."""

    fields: dict[str, Any] = Field(
        default_factory=dict, description="The form's fields by name (see GET /v1/approvals)."
    )
    comment: str | None = Field(default=None, max_length=2000)


class RejectRequest(_Body):
    reason: Reason


class OperatorActionRequest(_Body):
    """An operator action on a schedule or a scheduler; the reason goes into the audit."""

    reason: Reason | None = None


Name = Annotated[str, Field(pattern=NAME_PATTERN.pattern)]
"""An agent's, an action's or a dependency's name."""


class PauseRequest(_Body):
    """Pause or resume a run; the reason goes into its timeline."""

    reason: Reason


class ParkRequest(_Body):
    """Unpark or fail a run's parked steps; the reason goes into its timeline."""

    reason: Reason


class AgentPauseRequest(_Body):
    """Pause or resume an agent, or one of its actions; the reason goes into the audit."""

    reason: Reason
    action: Name | None = Field(default=None, description="Only this action (none: every one).")


class EventRequest(_Body):
    """An inbound event for event waits (docs/protocol.md, "Events"): idempotent on (name,
    id); it completes the open wait of its name whose correlation it carries, or waits for
    one to open within `retention` seconds."""

    name: str = Field(
        min_length=1, max_length=100, pattern=NAME_PATTERN.pattern, examples=["payment_confirmed"]
    )
    correlation: str | int = Field(
        description="The value the wait's `match` reads from its run (compared as text)."
    )
    id: str = Field(min_length=1, max_length=200, description="The sender's id of the event.")
    payload: Any = Field(default=None, description="JSON: the waiting step's output.")
    retention: float | None = Field(
        default=None,
        gt=0,
        description="Seconds an unmatched event is kept for a wait to open (default 7 days).",
    )


LIMIT_KEY = r"^(business_key|workflow|input(\.[A-Za-z0-9_-]{1,100})+)$"
"""What `KeyExpr.parse` reads (store/flow/model.py)."""


class LimitRequest(_Body):
    """A flow limit's whole definition (`PUT /v1/limits/{name}` replaces it); see
    docs/flow-control.md. What the schema cannot say is a 400 `invalid_input` that says
    why: a limit needs a rate, a concurrency or both; actions or a dependency, not both; a
    burst needs a rate; a rate written as text must read as `N/period`."""

    agent: Name = Field(description="The agent whose steps it limits.")
    actions: list[Name] | None = Field(
        default=None, min_length=1, max_length=MAX_ACTIONS, description="Only these actions [all]."
    )
    dependency: Name | None = Field(
        default=None, description="Only the agent's actions that use this dependency (breaker)."
    )
    key: str | None = Field(
        default=None,
        max_length=1000,
        pattern=LIMIT_KEY,
        description="One budget per value of `input.<field>[.<field>...]`, `business_key` or "
        "`workflow` [one budget].",
        examples=["input.account"],
    )
    rate: Annotated[float, Field(gt=0, le=MAX_RATE)] | str | None = Field(
        default=None,
        description="Steps started per second (a number), or per period (`100/s`, "
        "`6000/min`, `5/h`, `2/day`).",
        examples=["100/s"],
    )
    burst: int | None = Field(
        default=None, ge=1, le=MAX_COUNT, description="[one second of the rate]"
    )
    concurrency: int | None = Field(
        default=None,
        ge=0,
        le=MAX_COUNT,
        description="Steps in flight at once (per key); 0 pauses them.",
    )
    enabled: bool = True
    reason: Annotated[Reason, Field(description="Why (audited).")]


Examples = dict[str, dict[str, Any]]


def _examples(**values: tuple[str, dict[str, Any]]) -> Examples:
    return {name: {"summary": summary, "value": value} for name, (summary, value) in values.items()}


RUN_EXAMPLES = _examples(
    keyed=(
        "A run with a business key (idempotent) and a priority",
        {"workflow": "order", "input": {"qty": 2}, "key": "order-1042", "priority": 5},
    ),
    callback=(
        "A run whose summary is POSTed to a URL once it ends, its steps in pool `eu`",
        {
            "workflow": "order",
            "input": {"qty": 2},
            "key": "order-1043",
            "callback_url": "https://shop.example/hooks/sasflow",
            "pool": "eu",
        },
    ),
)
CANCEL_EXAMPLES = _examples(
    cancel=("Cancel", {"reason": "customer left"}),
    compensate=("Cancel and undo the processed steps", {"reason": "fraud", "compensate": True}),
)
RESUBMIT_EXAMPLES = _examples(
    again=("Run the failed steps again", {"reason": "the warehouse is back"}),
    corrected=(
        "From a step, with a corrected input",
        {"reason": "quantity fixed", "from_step": "reserve", "input": {"qty": 1}},
    ),
)
ACKNOWLEDGE_EXAMPLES = _examples(ack=("Acknowledge", {"reason": "known outage, ticket 4711"}))
ACTION_EXAMPLES = _examples(
    reason=("With a reason for the audit", {"reason": "maintenance window"}),
    bare=("No reason (no body at all is fine too)", {}),
)
LIMIT_EXAMPLES = _examples(
    rate=(
        "100 steps a second, 40 at once, for the payments agent",
        {"agent": "payments", "rate": "100/s", "concurrency": 40, "reason": "PSP quota"},
    ),
    keyed=(
        "One step at a time per account",
        {
            "agent": "payments",
            "actions": ["charge"],
            "key": "input.account",
            "concurrency": 1,
            "reason": "one charge per account at once",
        },
    ),
)
PAUSE_EXAMPLES = _examples(pause=("With the reason", {"reason": "customer asked to wait"}))
PARK_EXAMPLES = _examples(park=("With the reason", {"reason": "partner fixed their API"}))
AGENT_PAUSE_EXAMPLES = _examples(
    agent=("The whole agent", {"reason": "gateway maintenance"}),
    action=("One action", {"reason": "bad deploy of refunds", "action": "refund"}),
)

APPROVE_EXAMPLES = _examples(
    refund=(
        "Approve a refund with the form's amount",
        {"fields": {"amount": 120, "channel": "card"}, "comment": "customer is right"},
    ),
)
REJECT_EXAMPLES = _examples(reject=("With the reason", {"reason": "refund already paid by hand"}))
EVENT_EXAMPLES = _examples(
    payment=(
        "A partner's payment confirmation for order A-1042",
        {
            "name": "payment_confirmed",
            "correlation": "A-1042",
            "id": "evt_3PqX9",
            "payload": {"amount": 1200, "currency": "EUR"},
        },
    ),
)

BATCH_EXAMPLES = _examples(
    two=(
        "Two runs with business keys",
        {
            "runs": [
                {"workflow": "order", "input": {"qty": 2}, "key": "order-1042"},
                {"workflow": "order", "input": {"qty": 1}, "key": "order-1044", "priority": 5},
            ]
        },
    ),
)
