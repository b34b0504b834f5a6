"""The schedule cluster on real PostgreSQL: schedulers' cluster members (registration, lease,
acquisition, firing) driven step by step, with short leases, so each event order is chosen by
the test. Exactly once per tick, failover in both event orders, drain and undrain, fencing,
catch-up policies, the overload alarm and `schedulers list`'s figures."""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update

from sasflow.ops import registrations as scheduler_ops
from sasflow.ops import schedules as schedule_ops
from sasflow.registry import Registry
from sasflow.scheduler.cluster.firing import fire_due
from sasflow.scheduler.cluster.member import ClusterMember, ClusterOptions
from sasflow.schedules.definition import Schedule
from sasflow.store.cluster import schedules as store
from sasflow.store.db import transaction
from sasflow.store.schema import alerts, runs, schedule_ticks, schedules
from tests import harness
from tests.apps import basic

pytestmark = pytest.mark.integration

TTL = 1.0
NS = "sched-test"


@pytest.fixture
def registry() -> Registry:
    return Registry([basic.pipeline], [basic.echo])


@pytest.fixture
def members(engine: Engine, registry: Registry) -> Iterator[list[ClusterMember]]:
    made: list[ClusterMember] = []
    yield made
    for member in made:
        member.leave()


def join(
    members: list[ClusterMember],
    engine: Engine,
    registry: Registry,
    name: str,
    **options: Any,
) -> ClusterMember:
    member = ClusterMember(
        engine,
        registry,
        ClusterOptions(name=name, lease_ttl=options.pop("lease_ttl", TTL), **options),
        namespace=NS,
        actor=f"test-{name}",
    )
    members.append(member)
    member.step()
    return member


def add(
    engine: Engine, registry: Registry, count: int, *, every: int = 3600, **kw: Any
) -> list[int]:
    ids = []
    with transaction(engine) as conn:
        for _ in range(count):
            name = f"s{len(store.all_schedules(conn)) + 1}"
            row = schedule_ops.add(
                conn,
                Schedule(name, "pipeline", every=every, input={"text": name}, **kw),
                registry,
                actor="test",
                reason=None,
                namespace=NS,
            )
            ids.append(row["id"])
    return ids


def owners(engine: Engine) -> dict[int, str | None]:
    with engine.connect() as conn:
        return dict(conn.execute(select(schedules.c.id, schedules.c.owner)).all())


def held_by(engine: Engine, member: ClusterMember) -> int:
    reg = member.registration
    assert reg is not None
    return sum(1 for owner in owners(engine).values() if owner == reg.id)


def view(engine: Engine) -> dict[str, dict[str, Any]]:
    with transaction(engine) as conn:
        return {v["name"]: v for v in scheduler_ops.cluster_view(conn)}


def step_until(
    predicate: Any, *members: ClusterMember, timeout: float = 5.0, what: str = ""
) -> None:
    def stepped() -> bool:
        for member in members:
            member.step()
        return bool(predicate())

    harness.wait_for(stepped, timeout=timeout, what=what or "the cluster", interval=0.05)


def test_one_scheduler_holds_all_up_to_its_limit_and_list_shows_the_figures(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    add(engine, registry, 3)
    a = join(members, engine, registry, "a", alarm_threshold=10)
    assert held_by(engine, a) == 3
    b = join(members, engine, registry, "b", fault_tolerance=2)
    add(engine, registry, 2)
    step_until(lambda: all(owners(engine).values()), b, a, what="the new schedules acquired")
    figures = view(engine)
    assert {k: figures["a"][k] for k in ("state", "K", "S", "N", "M")} == {
        "state": "online",
        "K": 5,
        "S": 2,
        "N": 6,
        "M": 10,
    }
    assert figures["b"]["N"] == 1 + 5 // 1  # n=2: max(S - n, 1) = 1
    assert figures["a"]["X"] + figures["b"]["X"] == 5
    assert figures["a"]["X"] >= 3  # what A held stays with A


def test_a_scheduler_refuses_beyond_its_limit(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    """Three schedulers of tolerance 1 and K=21: N=11; the one holding 11 takes no more."""
    a = join(members, engine, registry, "a")
    add(engine, registry, 11)
    step_until(lambda: held_by(engine, a) == 11, a)
    b = join(members, engine, registry, "b")
    c = join(members, engine, registry, "c")
    add(engine, registry, 10)
    step_until(lambda: all(owners(engine).values()), a, b, c, what="K=21 held")
    assert held_by(engine, a) == 11
    assert view(engine)["a"]["N"] == 11
    assert held_by(engine, b) + held_by(engine, c) == 10


def test_each_tick_fires_once_even_when_fired_twice(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    """A schedule every second fires one run per tick, ticks consecutive; firing a tick again
    (as across a failover) makes no second run."""
    (sid,) = add(engine, registry, 1, every=1)
    a = join(members, engine, registry, "a")
    step_until(lambda: _ticks(engine, sid) >= 3, a, timeout=10, what="3 ticks")
    with engine.connect() as conn:
        fired = conn.execute(
            select(schedule_ticks.c.tick_at, schedule_ticks.c.run_id)
            .where(schedule_ticks.c.schedule_id == sid)
            .order_by(schedule_ticks.c.tick_at)
        ).all()
        run_count = conn.execute(select(func.count()).select_from(runs)).scalar_one()
    assert len({r.run_id for r in fired}) == len(fired) == run_count
    gaps = {(b.tick_at - a_.tick_at).total_seconds() for a_, b in itertools.pairwise(fired)}
    assert gaps == {1.0}
    # Fire the last tick again: the same run, no new tick row.
    with transaction(engine) as conn:
        conn.execute(update(schedules).values(next_tick_at=fired[-1].tick_at))
    with transaction(engine) as conn:
        reg = a.registration
        assert reg is not None
        fire_due(conn, registry, holder=reg.id, fired_by="again", namespace=NS)
    with engine.connect() as conn:
        keys = conn.execute(select(runs.c.business_key)).scalars().all()
        tick_rows = conn.execute(select(func.count()).select_from(schedule_ticks)).scalar_one()
    assert len(keys) == len(set(keys)) == tick_rows  # one run per tick, none twice
    assert f"schedule:{sid}:{fired[-1].tick_at.strftime('%Y-%m-%dT%H:%M:%S')}Z" in keys


def tick_rows(engine: Engine, sid: int) -> list[Any]:
    """The schedule's ticks, oldest first: their time and who fired them."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(schedule_ticks.c.tick_at, schedule_ticks.c.fired_by)
                .where(schedule_ticks.c.schedule_id == sid)
                .order_by(schedule_ticks.c.tick_at)
            )
        )


def _ticks(engine: Engine, sid: int) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(schedule_ticks.c.schedule_id == sid)
            ).scalar_one()
        )


@pytest.mark.parametrize(
    "release_first", [True, False], ids=["release-then-death", "death-then-release"]
)
def test_failover_in_either_event_order_leaves_nothing_unowned(
    engine: Engine, registry: Registry, members: list[ClusterMember], release_first: bool
) -> None:
    add(engine, registry, 4)
    a = join(members, engine, registry, "a")
    assert held_by(engine, a) == 4
    b = join(members, engine, registry, "b")
    reg_a = a.registration
    assert reg_a is not None
    if release_first:  # A releases one schedule (e.g. by an operator), then dies
        with transaction(engine) as conn:
            schedule_ops.release(conn, "1", actor="test", reason=None, namespace=NS)
    died = time.monotonic()  # A is never stepped again: its lease expires
    step_until(lambda: held_by(engine, b) == 4, b, timeout=TTL + 3, what="B takes A's schedules")
    assert time.monotonic() - died <= TTL + 1.5
    if not release_first:  # A's release arrives after B took over: it must change nothing
        with transaction(engine) as conn:
            assert not store.release(conn, 1, owner=reg_a.id)
        assert held_by(engine, b) == 4
    assert all(owners(engine).values())
    members.remove(a)


def test_no_tick_is_lost_across_a_failover(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    """A dies holding a schedule every second; B takes it over and, under catch-up `all`,
    fires every tick A missed: the ticks stay consecutive."""
    (sid,) = add(engine, registry, 1, every=1, catch_up="all", max_catch_up=100)
    a = join(members, engine, registry, "a")
    step_until(lambda: _ticks(engine, sid) >= 1, a, timeout=5)
    members.remove(a)  # dies: never stepped again
    b = join(members, engine, registry, "b")
    step_until(lambda: _ticks(engine, sid) >= 4, b, timeout=TTL + 6, what="B fires")
    ticks = tick_rows(engine, sid)
    assert {t.fired_by for t in ticks} == {"a", "b"}
    assert {(y.tick_at - x.tick_at).total_seconds() for x, y in itertools.pairwise(ticks)} == {1.0}


def test_drain_releases_and_undrain_acquires_again_and_drain_survives_a_restart(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    add(engine, registry, 4)
    a = join(members, engine, registry, "a")
    b = join(members, engine, registry, "b")
    assert held_by(engine, a) == 4
    with transaction(engine) as conn:
        scheduler_ops.drain(conn, "a", actor="test", reason="maintenance", namespace=NS)
    step_until(lambda: held_by(engine, b) == 4, a, b, what="A drained, B holds all")
    assert view(engine)["a"]["state"] == "drained"
    assert view(engine)["a"]["S"] == 2  # a drained scheduler is live: S counts it
    # A restart of A keeps it drained (the offline list is keyed by name).
    a.leave()
    members.remove(a)
    a = join(members, engine, registry, "a")
    a.step()
    assert held_by(engine, a) == 0
    assert view(engine)["a"]["state"] == "drained"
    # Undrain: first A may acquire again, then it acquires what is free.
    with transaction(engine) as conn:
        scheduler_ops.undrain(conn, "a", actor="test", reason="done", namespace=NS)
        schedule_ops.release(conn, "1", actor="test", reason="rebalance", namespace=NS)
        schedule_ops.release(conn, "2", actor="test", reason="rebalance", namespace=NS)
    a.wake()
    a.step()
    assert held_by(engine, a) == 2
    assert view(engine)["a"]["state"] == "online"


def test_a_scheduler_that_cannot_renew_stops_before_its_lease_expires_and_is_fenced(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    (sid,) = add(engine, registry, 1, every=1)
    a = join(members, engine, registry, "a")
    reg_a = a.registration
    assert reg_a is not None
    assert a.may_act
    # A stalls (GC pause, SIGSTOP, lost database): it stops acting at 3/4 of the TTL.
    time.sleep(TTL * 0.8)
    assert not a.may_act
    b = join(members, engine, registry, "b")
    step_until(lambda: held_by(engine, b) == 1, b, timeout=TTL + 2)
    before = _ticks(engine, sid)
    # A wakes and fires with its old registration: the lease check in the transaction fences it.
    with transaction(engine) as conn:
        conn.execute(update(schedules).values(next_tick_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)))
    with transaction(engine) as conn:
        report = fire_due(conn, registry, holder=reg_a.id, fired_by="a", namespace=NS)
    assert report.fired == 0
    assert _ticks(engine, sid) == before
    # A's next step re-registers (a new registration) and holds nothing B holds.
    a.step()
    assert a.registration is not None
    assert a.registration.id != reg_a.id
    assert held_by(engine, b) == 1


@pytest.mark.parametrize(("policy", "expected"), [("latest", 1), ("all", 3), ("skip", 0)])
def test_catch_up_policy_for_ticks_missed_while_unowned(
    engine: Engine, registry: Registry, members: list[ClusterMember], policy: str, expected: int
) -> None:
    (sid,) = add(engine, registry, 1, every=60, catch_up=policy, max_catch_up=3)
    with transaction(engine) as conn:  # ten minutes of ticks passed with no scheduler
        conn.execute(update(schedules).values(next_tick_at=func.now() - dt.timedelta(minutes=10)))
    join(members, engine, registry, "a")
    assert _ticks(engine, sid) == expected
    with engine.connect() as conn:
        next_tick = conn.execute(select(schedules.c.next_tick_at, func.now())).one()
    assert next_tick[0] > next_tick[1]


def test_overload_alarm_is_raised_above_m_and_resolved_at_or_below(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    ids = add(engine, registry, 3)
    a = join(members, engine, registry, "a", alarm_threshold=2)
    assert held_by(engine, a) == 3
    assert _open_alarms(engine) == 1
    with transaction(engine) as conn:
        schedule_ops.remove(conn, str(ids[0]), actor="test", reason=None, namespace=NS)
    a.wake()
    a.step()
    assert _open_alarms(engine) == 0


def _open_alarms(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(
                    alerts.c.kind == "scheduler_overloaded", alerts.c.acknowledged.is_(False)
                )
            ).scalar_one()
        )


def test_a_draining_scheduler_hands_a_schedule_over_right_after_its_tick(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    """A schedule every second is released in the transaction that submits its tick: the
    next scheduler fires the following tick; no tick is missed or fired twice."""
    (sid,) = add(engine, registry, 1, every=1, catch_up="skip")
    a = join(members, engine, registry, "a")
    step_until(lambda: _ticks(engine, sid) >= 1, a, timeout=5)
    b = join(members, engine, registry, "b")
    with transaction(engine) as conn:
        scheduler_ops.drain(conn, "a", actor="test", reason=None, namespace=NS)
    step_until(lambda: held_by(engine, b) == 1, a, b, timeout=5, what="handed over")
    step_until(lambda: _ticks(engine, sid) >= 4, a, b, timeout=6, what="B fires")
    ticks = tick_rows(engine, sid)
    assert next(t.fired_by for t in ticks) == "a"
    assert [t.fired_by for t in ticks][-1] == "b"
    assert {(y.tick_at - x.tick_at).total_seconds() for x, y in itertools.pairwise(ticks)} == {1.0}
    assert view(engine)["a"]["state"] == "drained"


def test_a_backlog_is_fired_oldest_first_within_a_tick_budget_per_transaction(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    """Ten ticks fell due while held: a transaction fires at most its budget, the oldest first,
    and the next ones continue where it stopped; none is skipped or fired twice."""
    (sid,) = add(engine, registry, 1, every=1, catch_up="skip")
    a = join(members, engine, registry, "a")
    reg = a.registration
    assert reg is not None
    with transaction(engine) as conn:
        conn.execute(
            update(schedules).values(
                acquired_at=func.now() - dt.timedelta(hours=1),
                next_tick_at=func.date_trunc("second", func.now()) - dt.timedelta(seconds=9),
            )
        )
    reports = []
    for _ in range(6):
        with transaction(engine) as conn:
            reports.append(
                fire_due(conn, registry, holder=reg.id, fired_by="a", namespace=NS, tick_budget=3)
            )
    assert [r.fired for r in reports[:3]] == [3, 3, 3]
    assert reports[0].more
    ticks = [t.tick_at for t in tick_rows(engine, sid)]
    assert len(ticks) >= 10
    assert {(y - x).total_seconds() for x, y in itertools.pairwise(ticks)} == {1.0}


def test_a_tick_that_cannot_be_submitted_is_recorded_with_its_error_and_others_fire(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    """A schedule of a workflow the scheduler's app no longer has: its tick is recorded with
    the error (not retried); the batch's other schedules fire as usual."""
    wider = Registry([basic.pipeline, basic.diamond], [basic.echo])
    with transaction(engine) as conn:
        gone = schedule_ops.add(
            conn, Schedule("gone", "diamond", every=1), wider, actor="t", reason=None, namespace=NS
        )["id"]
    (fine,) = add(engine, registry, 1, every=1)
    a = join(members, engine, registry, "a")
    step_until(lambda: _ticks(engine, gone) >= 1 and _ticks(engine, fine) >= 1, a, timeout=5)
    with engine.connect() as conn:
        rows = conn.execute(
            select(schedule_ticks.c.schedule_id, schedule_ticks.c.run_id, schedule_ticks.c.error)
        ).all()
    assert all(
        r.run_id is None and "unknown workflow 'diamond'" in r.error
        for r in rows
        if r.schedule_id == gone
    )
    assert all(r.run_id is not None and r.error is None for r in rows if r.schedule_id == fine)


def test_a_second_scheduler_with_a_live_name_waits_unregistered_until_the_name_is_free(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    a = join(members, engine, registry, "a")
    twin = join(members, engine, registry, "a")
    assert twin.registration is None
    assert not twin.may_act  # no tick fired, no step claimed
    a.leave()
    members.remove(a)
    step_until(lambda: twin.registration is not None, twin, timeout=TTL + 2)
    assert twin.may_act
