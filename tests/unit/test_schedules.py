"""The acquisition limit N (the issue's 5-scheduler table), tick timing and catch-up, and the
Schedule definition's validation: pure functions, no I/O."""

from __future__ import annotations

import datetime as dt

import pytest

from sasflow.errors import DefinitionError, InvalidScheduleError, UnknownWorkflowError
from sasflow.registry import Registry
from sasflow.scheduler.cluster.limits import hold_limit
from sasflow.schedules.definition import Schedule
from sasflow.schedules.timing import CatchUp, Timing, tick_key, ticks_to_fire
from tests.apps import basic


def at(hour: int, minute: int, second: int = 0) -> dt.datetime:
    return dt.datetime(2026, 3, 29, hour, minute, second, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("active", "expected"),
    [(10, [3, 3, 4, 6, 11]), (12, [4, 4, 5, 7, 13]), (15, [4, 4, 6, 8, 16])],
)
def test_limit_of_five_heterogeneous_schedulers(active: int, expected: list[int]) -> None:
    """With 5 live schedulers of fault tolerance 1, 1, 2, 3, 4: the issue's table, exactly."""
    tolerances = [1, 1, 2, 3, 4]
    assert [hold_limit(active, 5, n) for n in tolerances] == expected


def test_limit_of_the_walk_through() -> None:
    """One scheduler holds everything (N = 1 + K); three of tolerance 1 with K=21: N=11."""
    assert hold_limit(11, 1, 1) == 12
    assert hold_limit(21, 3, 1) == 11
    assert hold_limit(0, 0, 1) == 1


def test_limit_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="n=0"):
        hold_limit(10, 3, 0)


def test_interval_ticks_fall_on_multiples_since_the_epoch() -> None:
    timing = Timing(interval_s=300)
    assert timing.next_after(at(1, 2, 3)) == at(1, 5)
    assert timing.next_after(at(1, 5)) == at(1, 10)
    ticks = timing.backwards(at(1, 5))
    assert [next(ticks), next(ticks)] == [at(1, 5), at(1, 0)]


def test_cron_in_a_time_zone_across_daylight_saving() -> None:
    """02:30 Paris does not exist on 2026-03-29 (clocks jump from 02:00 to 03:00): the tick
    fires at the jump, 03:00 summer time (01:00 UTC); the next day 02:30 is 00:30 UTC."""
    timing = Timing(cron="30 2 * * *", timezone="Europe/Paris")
    assert timing.next_after(at(0, 0)) == at(1, 0)
    assert timing.next_after(at(1, 0)) == dt.datetime(2026, 3, 30, 0, 30, tzinfo=dt.UTC)


def test_cron_with_seconds() -> None:
    timing = Timing(cron="* * * * * */15")
    assert timing.next_after(at(1, 0, 1)) == at(1, 0, 15)
    assert next(timing.backwards(at(1, 0, 15))) == at(1, 0, 15)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (CatchUp.LATEST, [at(1, 5), at(1, 6), at(1, 7)]),
        (CatchUp.ALL, [at(1, 3), at(1, 4), at(1, 5), at(1, 6), at(1, 7)]),
        (CatchUp.SKIP, [at(1, 6), at(1, 7)]),
    ],
)
def test_catch_up_policies(policy: CatchUp, expected: list[dt.datetime]) -> None:
    """Ticks 01:00..01:07 due; acquired at 01:05:30: 01:06 and 01:07 fell due while held (fired
    always), 01:00..01:05 were missed: newest one, the newest 3 (max), or none."""
    fired = ticks_to_fire(
        Timing(cron="* * * * *"),
        since=at(1, 0),
        now=at(1, 7, 10),
        acquired_at=at(1, 5, 30),
        catch_up=policy,
        max_catch_up=3,
    )
    assert fired == expected


def test_nothing_due_before_the_next_tick() -> None:
    fired = ticks_to_fire(
        Timing(interval_s=60),
        since=at(1, 1),
        now=at(1, 0, 59),
        acquired_at=at(0, 0),
        catch_up=CatchUp.ALL,
        max_catch_up=10,
    )
    assert fired == []


def test_tick_key_is_the_utc_iso_time() -> None:
    paris = dt.timezone(dt.timedelta(hours=2))
    assert (
        tick_key(7, dt.datetime(2026, 6, 1, 4, 0, tzinfo=paris))
        == "schedule:7:2026-06-01T02:00:00Z"
    )
    assert tick_key(7, at(1, 0).replace(microsecond=5)) == "schedule:7:2026-03-29T01:00:00.000005Z"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "not a cron"}, "invalid cron"),
        ({}, "exactly one"),
        ({"cron": "* * * * *", "every": 5}, "exactly one"),
        ({"every": 0}, "at least 1"),
        ({"every": 5, "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": 5, "catch_up": "sometimes"}, "unknown catch-up policy"),
        ({"every": 5, "max_catch_up": 0}, "at least 1"),
        ({"every": 5, "input": {"x": float("nan")}}, "not JSON"),
    ],
)
def test_schedule_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidScheduleError, match=message):
        Schedule("s", "pipeline", **kwargs)  # type: ignore[arg-type]


def test_registry_checks_schedules() -> None:
    schedule = Schedule("nightly", "pipeline", cron="0 2 * * *")
    registry = Registry([basic.pipeline], [basic.echo], schedules=[schedule])
    assert registry.schedules == (schedule,)
    with pytest.raises(DefinitionError, match="duplicate schedule"):
        Registry([basic.pipeline], [basic.echo], schedules=[schedule, schedule])
    with pytest.raises(UnknownWorkflowError, match="nope"):
        Registry([basic.pipeline], [basic.echo], schedules=[Schedule("x", "nope", every=5)])
