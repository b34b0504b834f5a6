"""When a schedule ticks: cron expressions (croniter, in the schedule's time zone) or a fixed
interval, and which due ticks to fire under each catch-up policy.

Every time here is a timezone-aware UTC datetime read from the database clock; this module
never reads a process clock.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from sasflow.errors import InvalidScheduleError

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MAX_HELD_TICKS = 1000
"""At most this many ticks that fell due while held are fired by one scan (a bound on the work
of a scan, not a policy: a held schedule is normally at most a tick or two behind)."""


class CatchUp(StrEnum):
    """What to do with the ticks that fell due while no scheduler held the schedule."""

    LATEST = "latest"
    """Fire once, for the newest missed tick."""
    ALL = "all"
    """Fire every missed tick, at most `max_catch_up` of them (the newest)."""
    SKIP = "skip"
    """Fire none of them."""


@dataclass(frozen=True)
class Timing:
    """A cron expression (5 fields, or 6 with seconds last, croniter's form) in `timezone`, or
    a fixed interval of whole seconds counted from the Unix epoch (UTC)."""

    cron: str | None = None
    interval_s: int | None = None
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.interval_s is None):
            raise InvalidScheduleError(
                "a schedule needs exactly one of a cron expression and an interval"
            )
        if self.cron is not None and not croniter.is_valid(self.cron):
            raise InvalidScheduleError(f"invalid cron expression {self.cron!r}")
        if self.interval_s is not None and (
            not isinstance(self.interval_s, int) or self.interval_s < 1
        ):
            raise InvalidScheduleError(
                f"interval must be a whole number of seconds, at least 1 (got {self.interval_s!r})"
            )
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise InvalidScheduleError(f"unknown time zone {self.timezone!r}") from exc

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron!r} ({self.timezone})"
        return f"every {self.interval_s}s"

    def next_after(self, t: dt.datetime) -> dt.datetime:
        """The first tick strictly after `t`."""
        if self.interval_s is not None:
            k = math.floor((t - EPOCH).total_seconds() / self.interval_s) + 1
            return EPOCH + dt.timedelta(seconds=k * self.interval_s)
        it = croniter(self.cron or "", t.astimezone(ZoneInfo(self.timezone)))
        return it.get_next(dt.datetime).astimezone(dt.UTC)

    def backwards(self, t: dt.datetime) -> Iterator[dt.datetime]:
        """The ticks at or before `t`, newest first (endless: the caller stops)."""
        if self.interval_s is not None:
            k = math.floor((t - EPOCH).total_seconds() / self.interval_s)
            while True:
                yield EPOCH + dt.timedelta(seconds=k * self.interval_s)
                k -= 1
        # croniter's get_prev is strictly before its start: start a microsecond after `t`.
        it = croniter(
            self.cron or "", (t + dt.timedelta(microseconds=1)).astimezone(ZoneInfo(self.timezone))
        )
        while True:
            yield it.get_prev(dt.datetime).astimezone(dt.UTC)


def ticks_to_fire(
    timing: Timing,
    *,
    since: dt.datetime,
    now: dt.datetime,
    acquired_at: dt.datetime,
    catch_up: CatchUp,
    max_catch_up: int,
) -> list[dt.datetime]:
    """The ticks to fire now, oldest first, of the ticks in [`since`, `now`].

    Ticks at or after `acquired_at` fell due while this owner held the schedule: each is
    fired. Older ones were missed (no scheduler held it): the catch-up policy picks among them.
    """
    missed_wanted = {CatchUp.LATEST: 1, CatchUp.ALL: max_catch_up, CatchUp.SKIP: 0}[catch_up]
    held: list[dt.datetime] = []
    missed: list[dt.datetime] = []
    for tick in timing.backwards(now):
        if tick < since:
            break
        if tick >= acquired_at:
            if len(held) < MAX_HELD_TICKS:
                held.append(tick)
            continue
        if len(missed) >= missed_wanted:
            break
        missed.append(tick)
    return sorted(held + missed)


def tick_key(schedule_id: int, tick: dt.datetime) -> str:
    """The business key of a tick's run: `schedule:<id>:<tick time in UTC, ISO 8601>`."""
    utc = tick.astimezone(dt.UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S.%f" if utc.microsecond else "%Y-%m-%dT%H:%M:%S")
    return f"schedule:{schedule_id}:{text}Z"
