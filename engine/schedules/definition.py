"""`Schedule`: a recurring submission of a workflow, defined in Python next to the workflows
(`Registry(schedules=[...])`) or at run time (`sasflow schedules add`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sasflow.errors import InvalidScheduleError
from sasflow.schedules.timing import CatchUp, Timing
from sasflow.workflow import NAME_PATTERN

DEFAULT_MAX_CATCH_UP = 10


@dataclass(frozen=True)
class Schedule:
    """Submit `workflow` with `input` at every tick of `cron` (in `timezone`) or `every`
    seconds; ticks missed while no scheduler held it follow `catch_up`."""

    name: str
    workflow: str
    cron: str | None = None
    every: int | None = None
    """Seconds between ticks (ticks fall on multiples of it since the Unix epoch, UTC)."""
    input: Any = field(default_factory=dict)
    timezone: str = "UTC"
    catch_up: CatchUp | str = CatchUp.LATEST
    max_catch_up: int = DEFAULT_MAX_CATCH_UP

    def __post_init__(self) -> None:
        if not NAME_PATTERN.fullmatch(self.name):
            raise InvalidScheduleError(
                f"schedule name {self.name!r} must match {NAME_PATTERN.pattern}"
            )
        self.timing  # noqa: B018 - validates the cron or interval and the time zone
        try:
            object.__setattr__(self, "catch_up", CatchUp(self.catch_up))
        except ValueError:
            choices = ", ".join(c.value for c in CatchUp)
            raise InvalidScheduleError(
                f"unknown catch-up policy {self.catch_up!r} (one of: {choices})"
            ) from None
        if not isinstance(self.max_catch_up, int) or self.max_catch_up < 1:
            raise InvalidScheduleError(
                f"max_catch_up must be at least 1 (got {self.max_catch_up!r})"
            )
        try:
            json.dumps(self.input, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidScheduleError(f"schedule {self.name!r}: input is not JSON: {exc}") from exc

    @property
    def timing(self) -> Timing:
        return Timing(cron=self.cron, interval_s=self.every, timezone=self.timezone)

    @property
    def policy(self) -> CatchUp:
        return CatchUp(self.catch_up)
