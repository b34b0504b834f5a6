"""The fleet's wire messages (docs/protocol.md, section 6): agent heartbeats on `<ns>.fleet`
and breaker announcements on `<ns>.breakers.<agent>`. Plain pydantic, so agents load no
database library to speak them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sasflow.workflow import NAME_PATTERN

_NAME = NAME_PATTERN.pattern

BreakerStateName = Literal["closed", "open", "half-open"]


class _FleetMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=False)

    def encode(self) -> bytes:
        return self.model_dump_json().encode()


class AgentHeartbeat(_FleetMessage):
    """An agent instance says it is alive (on start, every `interval_s`) or leaving (`stopping`
    on a clean exit)."""

    type: Literal["agent.heartbeat"] = "agent.heartbeat"
    agent: str = Field(pattern=_NAME, max_length=100)
    instance_id: str = Field(min_length=1, max_length=100)
    hostname: str = Field(max_length=255)
    pid: int = Field(ge=0, le=2**31 - 1)
    version: str = Field(max_length=50)
    concurrency: int = Field(ge=0, le=2**31 - 1)
    in_flight: int = Field(ge=0, le=2**31 - 1)
    breakers: dict[str, BreakerStateName] = Field(default_factory=dict, max_length=1000)
    interval_s: float = Field(gt=0, le=86400)
    seq: int = Field(default=0, ge=0, le=2**63 - 1)
    """Counts this instance's heartbeats from 1 (0: not counted, never ignored as stale)."""
    stopping: bool = False
    actions: dict[str, str | None] | None = Field(default=None, max_length=10000)
    """Each action the instance handles -> the dependency (breaker) it calls through, or null;
    None: not said (an agent older than the field). Resolves flow limits set on a dependency."""
    held: int = Field(default=0, ge=0, le=2**31 - 1)
    """Worker threads held by handlers running on past their deadline (and its grace); equal
    to `concurrency`: the instance is wedged and takes no requests (0: none, or an agent older
    than the field)."""
    breakers_open_for_s: dict[str, float] = Field(default_factory=dict, max_length=1000)
    """For each open breaker: seconds until it lets a trial call through (its reset timeout
    left). With `breakers`, lets the claim hold the dependency's steps until then."""

    @field_validator("actions")
    @classmethod
    def _names(cls, value: dict[str, str | None] | None) -> dict[str, str | None] | None:
        for action, dependency in (value or {}).items():
            for name in (action, dependency):
                if name is not None and not NAME_PATTERN.fullmatch(name):
                    raise ValueError(f"{name!r} must match {_NAME}")
        return value

    @field_validator("breakers_open_for_s")
    @classmethod
    def _seconds(cls, value: dict[str, float]) -> dict[str, float]:
        for dependency, seconds in value.items():
            if not NAME_PATTERN.fullmatch(dependency) or not 0 <= seconds <= 86400:
                raise ValueError(f"{dependency!r}: seconds must be 0 to 86400")
        return value


class BreakerAnnouncement(_FleetMessage):
    """One instance's breaker for `dependency` opened (`open_for_s`: seconds until it lets a
    trial call through) or closed (its trial call succeeded)."""

    type: Literal["breaker.state"] = "breaker.state"
    agent: str = Field(pattern=_NAME, max_length=100)
    instance_id: str = Field(min_length=1, max_length=100)
    dependency: str = Field(pattern=_NAME, max_length=100)
    state: Literal["open", "closed"]
    open_for_s: float = Field(default=0.0, ge=0, le=86400)
