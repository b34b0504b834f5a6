"""The request bodies of the REST API (pydantic): what OpenAPI shows and FastAPI validates."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

from sasflow.api.validation import INT_MAX, Reason

POOL_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunRequest(_Body):
    """Submit a run of `workflow`; idempotent on (workflow, key)."""

    workflow: str = Field(min_length=1, max_length=100, examples=["orders"])
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


class CancelRequest(_Body):
    reason: Reason
    compensate: bool = Field(default=False, description="Undo the processed steps.")


class ResubmitRequest(_Body):
    reason: Reason
    from_step: str | None = Field(default=None, min_length=1, max_length=100)
    input: dict[str, Any] | None = Field(default=None, description="A corrected run input.")


class AcknowledgeRequest(_Body):
    reason: Reason


class OperatorActionRequest(_Body):
    """An operator action on a schedule or a scheduler; the reason goes into the audit."""

    reason: Reason | None = None


class LimitRequest(_Body):
    """A flow limit's whole definition (`PUT /v1/limits/{name}` replaces it); see
    docs/flow-control.md."""

    agent: str = Field(min_length=1, max_length=100, description="The agent whose steps it limits.")
    actions: list[str] | None = Field(
        default=None, min_length=1, max_length=100, description="Only these actions [all]."
    )
    dependency: str | None = Field(
        default=None,
        max_length=100,
        description="Only the agent's actions that use this dependency (breaker).",
    )
    key: str | None = Field(
        default=None,
        max_length=200,
        description="One budget per value of `input.<field>[.<field>...]`, `business_key` or "
        "`workflow` [one budget].",
        examples=["input.account"],
    )
    rate: float | str | None = Field(
        default=None,
        description="Steps started per second (a number), or per period (`6000/min`).",
        examples=["100/s"],
    )
    burst: int | None = Field(
        default=None, ge=1, le=INT_MAX, description="[one second of the rate]"
    )
    concurrency: int | None = Field(
        default=None,
        ge=0,
        le=INT_MAX,
        description="Steps in flight at once (per key); 0 pauses them.",
    )
    enabled: bool = True
    reason: Annotated[Reason, Field(description="Why (audited).")]
