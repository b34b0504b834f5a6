"""The scope strategy on real PostgreSQL: cluster members driven step by step with short
leases. The plan follows the formula after each change, the epoch fences a scheduler paused
through a reshard, a reshard waits for the firings in progress, a leader's death hands the
lead over within TTL + 1 s, and a scheduler of another strategy is refused."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, func, text, update

from sasflow.cli.main import cli
from sasflow.errors import AssignmentConflictError
from sasflow.ops import registrations as scheduler_ops
from sasflow.registry import Registry
from sasflow.scheduler.cluster.firing import fire_due
from sasflow.scheduler.cluster.member import ClusterMember, ClusterOptions
from sasflow.scheduler.cluster.plan import even_ranges
from sasflow.scheduler.cluster.scope import ScopeStrategy
from sasflow.store.db import transaction
from sasflow.store.schema import schedulers
from tests import harness
from tests.apps import basic
from tests.integration.test_schedule_cluster import NS, TTL, add, owners, step_until

pytestmark = pytest.mark.integration


@pytest.fixture
def registry() -> Registry:
    return Registry([basic.pipeline], [basic.echo])


@pytest.fixture
def members() -> Iterator[list[ClusterMember]]:
    made: list[ClusterMember] = []
    yield made
    for member in made:
        member.leave()


def join(
    members: list[ClusterMember], engine: Engine, registry: Registry, name: str, **kw: Any
) -> ClusterMember:
    member = ClusterMember(
        engine,
        registry,
        ClusterOptions(name=name, address=kw.pop("address", f"10.0.0.{name}"), lease_ttl=TTL, **kw),
        namespace=NS,
        actor=f"test-{name}",
    )
    members.append(member)
    member.step()
    return member


def scope(**kw: Any) -> dict[str, Any]:
    return {"assignment": "scope", **kw}


def plan(engine: Engine) -> dict[str, Any]:
    with transaction(engine) as conn:
        return scheduler_ops.plan_view(conn)


def plan_is(engine: Engine, names: list[str], active: int) -> bool:
    """The ready plan gives `names` (in order) the formula's ranges of `active` schedules."""
    current = plan(engine)
    return current["state"] == "ready" and [
        (r["name"], r["first"], r["last"]) for r in current["ranges"]
    ] == [(n, f, last) for n, (f, last) in zip(names, even_ranges(active, len(names)), strict=True)]


def strategy(member: ClusterMember) -> ScopeStrategy:
    assert isinstance(member.strategy, ScopeStrategy)
    return member.strategy


def holders(engine: Engine, members: list[ClusterMember]) -> dict[str, list[int]]:
    """Per member name, the ids of the schedules it holds."""
    by_reg = {m.registration.id: m.name for m in members if m.registration is not None}
    held: dict[str, list[int]] = {}
    for sid, owner in sorted(owners(engine).items()):
        held.setdefault(by_reg.get(owner or "", "-"), []).append(sid)
    return held


def test_the_plan_follows_the_formula_after_each_change_and_list_shows_it(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    add(engine, registry, 10)
    # Addresses order the plan, not names or start order.
    c = join(members, engine, registry, "c", address="10.0.0.3", **scope())
    a = join(members, engine, registry, "a", address="10.0.0.1", **scope())
    b = join(members, engine, registry, "b", address="10.0.0.2", **scope())
    step_until(lambda: plan_is(engine, ["a", "b", "c"], 10), c, a, b, what="plan a, b, c")
    step_until(
        lambda: holders(engine, members) == {"a": [1, 2, 3], "b": [4, 5, 6], "c": [7, 8, 9, 10]},
        a,
        b,
        c,
        what="each holds its range",
    )
    current = plan(engine)
    assert current["leader"] == "c"  # the first to start leads
    view = {v["name"]: v for v in _cluster(engine)}
    assert [(view[n]["range"], view[n]["N"], view[n]["X"]) for n in "abc"] == [
        ("1-3", 3, 3),
        ("4-6", 3, 3),
        ("7-10", 4, 4),
    ]
    assert [view[n]["leader"] for n in "abc"] == [False, False, True]
    assert {view[n]["epoch"] for n in "abc"} == {current["epoch"]}
    # A schedule added between reshards is covered by the last range at once; the leader
    # re-plans for K = 11.
    add(engine, registry, 1)
    step_until(lambda: plan_is(engine, ["a", "b", "c"], 11), c, a, b, what="plan of K=11")
    assert plan(engine)["epoch"] > current["epoch"]
    # A clean leave: the two others share everything.
    b.leave()
    members.remove(b)
    step_until(lambda: plan_is(engine, ["a", "c"], 11), c, a, what="plan without b")
    step_until(lambda: set(holders(engine, members)) == {"a", "c"}, a, c, what="b's handed over")
    # The CLI shows the same.
    env = {"SASFLOW_DATABASE_URL": str(engine.url.render_as_string(hide_password=False))}
    listed = CliRunner().invoke(cli, ["schedulers", "list"], env=env)
    assert listed.exit_code == 0, listed.output
    assert "epoch" in listed.output
    assert "1-5" in listed.output
    assert "6-11" in listed.output
    planned = CliRunner().invoke(cli, ["schedulers", "plan"], env=env)
    assert planned.exit_code == 0, planned.output
    assert "leader c" in planned.output
    assert "ready" in planned.output


def _cluster(engine: Engine) -> list[dict[str, Any]]:
    with transaction(engine) as conn:
        return scheduler_ops.cluster_view(conn)


def test_a_scheduler_paused_through_a_reshard_cannot_fire_on_the_old_plan(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    add(engine, registry, 6, every=1)
    a = join(members, engine, registry, "a", **scope())
    b = join(members, engine, registry, "b", **scope())
    step_until(lambda: plan_is(engine, ["a", "b"], 6), a, b, what="plan a, b")
    step_until(lambda: strategy(b).bounds is not None, b, what="b follows the plan")
    old_epoch, reg_b = strategy(b).epoch, b.registration
    assert reg_b is not None
    # B pauses (never stepped); A leads and reshards when C joins.
    c = join(members, engine, registry, "c", **scope())
    step_until(lambda: plan_is(engine, ["a", "b", "c"], 6), a, c, what="plan a, b, c")
    assert plan(engine)["epoch"] != old_epoch
    # B wakes up: its fence finds its epoch stale, so its firing transaction fires nothing
    # (ClusterMember._fire_once returns before fire_due), though it still holds due
    # schedules of its old range.
    with transaction(engine) as conn:
        assert strategy(b).fence(conn, reg_b) is None
    step_until(lambda: strategy(b).epoch == plan(engine)["epoch"], b, what="b follows")
    step_until(
        lambda: holders(engine, members) == {"a": [1, 2], "b": [3, 4], "c": [5, 6]},
        a,
        b,
        c,
        what="the new ranges held",
    )


def test_a_reshard_waits_for_the_firing_in_progress(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    """A firing transaction holds the plan row FOR SHARE: the leader's new epoch commits only
    after it, so no firing on the old plan starts or runs after the reshard began."""
    add(engine, registry, 4)
    a = join(members, engine, registry, "a", **scope())
    step_until(lambda: plan_is(engine, ["a"], 4), a, what="plan a")
    step_until(lambda: strategy(a).bounds is not None, a, what="a follows the plan")
    reg_a = a.registration
    assert reg_a is not None
    resharded = threading.Event()
    with transaction(engine) as conn:  # A's firing transaction, in progress
        assert strategy(a).fence(conn, reg_a) is not None
        fire_due(conn, registry, holder=reg_a.id, fired_by="a", namespace=NS)
        join(members, engine, registry, "b", **scope())

        def lead() -> None:
            a.wake()
            a.step()  # the leader sees b and reshards
            resharded.set()

        leader = threading.Thread(target=lead)
        leader.start()
        harness.wait_for(
            lambda: _waiting_on_a_lock(engine), timeout=5, what="the reshard waiting for a lock"
        )
        assert not resharded.is_set()
    leader.join(timeout=10)
    assert resharded.is_set()
    step_until(lambda: plan_is(engine, ["a", "b"], 4), a, what="plan a, b")


def _waiting_on_a_lock(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "select count(*) from pg_stat_activity"
                    " where datname = current_database() and wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_the_leader_s_death_hands_the_lead_over_within_ttl_plus_one_second(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    add(engine, registry, 9)
    a = join(members, engine, registry, "a", **scope())
    b = join(members, engine, registry, "b", **scope())
    c = join(members, engine, registry, "c", **scope())
    step_until(lambda: plan_is(engine, ["a", "b", "c"], 9), a, b, c, what="plan a, b, c")
    assert plan(engine)["leader"] == "a"
    members.remove(a)  # A dies: never stepped again
    died = time.monotonic()
    step_until(lambda: plan_is(engine, ["b", "c"], 9), b, c, timeout=TTL + 4, what="plan without a")
    assert time.monotonic() - died <= TTL + 1.5
    assert plan(engine)["leader"] in {"b", "c"}
    step_until(lambda: set(holders(engine, members)) == {"b", "c"}, b, c, what="a's handed over")


def test_a_scheduler_of_another_strategy_is_refused(
    engine: Engine, registry: Registry, members: list[ClusterMember], database_url: str
) -> None:
    join(members, engine, registry, "a", **scope())
    with pytest.raises(AssignmentConflictError, match=r"--assignment acquire.*--assignment scope"):
        join(members, engine, registry, "b")
    members.pop()
    result = CliRunner().invoke(
        cli,
        ["scheduler", "--name", "c", "--assignment", "acquire", "--lease-ttl", "1"],
        env={
            "SASFLOW_DATABASE_URL": database_url,
            "SASFLOW_APP": "tests.apps.basic",
            "SASFLOW_NAMESPACE": NS,
        },
    )
    assert result.exit_code == 78, result.output
    assert "the whole cluster uses one strategy" in result.output


def test_a_scheduler_registering_again_keeps_its_range_without_a_reshard(
    engine: Engine, registry: Registry, members: list[ClusterMember]
) -> None:
    """Ranges are planned by name: a scheduler whose lease lapsed (a stall) and that registers
    again under its name takes its range's schedules back itself; the epoch stays."""
    add(engine, registry, 4)
    a = join(members, engine, registry, "a", **scope())
    b = join(members, engine, registry, "b", **scope())
    step_until(lambda: plan_is(engine, ["a", "b"], 4), a, b, what="plan a, b")
    step_until(lambda: holders(engine, members) == {"a": [1, 2], "b": [3, 4]}, a, b)
    epoch, old = plan(engine)["epoch"], b.registration
    # B's lease lapses (a stall) and B is back before the leader's next scan.
    assert old is not None
    time.sleep(TTL / 3)  # its renewal is due
    with transaction(engine) as conn:
        conn.execute(
            update(schedulers).where(schedulers.c.id == old.id).values(lease_expires_at=func.now())
        )
    b.step()  # its renewal fails: it registers again, under a new registration id
    assert b.registration is not None
    assert b.registration.id != old.id
    step_until(lambda: holders(engine, members) == {"a": [1, 2], "b": [3, 4]}, b, a)
    assert plan(engine)["epoch"] == epoch
