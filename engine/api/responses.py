"""The response bodies of the schedule, scheduler and agent endpoints (pydantic): what OpenAPI
shows. Request bodies are in `models.py`; each response model is named `...Response`.

The service functions return dicts; FastAPI validates them against these models on the way
out. Extra keys pass through (`extra="allow"`), so a column added to the store shows up
without losing anything until its field is named here."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


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
    breakers: dict[str, Any] = Field(description="Circuit breaker states by name.")
    heartbeat_at: datetime
    seconds_since_heartbeat: float


class AgentListResponse(_Response):
    agents: list[AgentResponse]
