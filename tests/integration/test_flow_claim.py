"""The budgeted claim on PostgreSQL (store/flow/claim.py): rates refill on the database clock,
held steps are not touched, and concurrent claimers in separate connections never take a key
past its concurrency nor a rate past its budget; breakers and dependencies resolved from the
fleet; the waiting reason of a held step."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, select, text, update

from sasflow import submit_run
from sasflow.store.cluster.fleet import InstanceReport, record_heartbeats
from sasflow.store.db import transaction
from sasflow.store.flow import limits
from sasflow.store.flow.claim import BudgetedClaim, claim_budgeted
from sasflow.store.flow.explain import waiting_reasons
from sasflow.store.flow.fleet import read_fleet
from sasflow.store.flow.model import KeyExpr, Limit
from sasflow.store.flow.plan import FlowPlan, make_plan
from sasflow.store.runs.claim import claim_steps
from sasflow.store.schema import steps
from tests.apps import flow

pytestmark = pytest.mark.integration


def _submit(engine: Engine, workflow: str, accounts: list[str], prefix: str = "r") -> None:
    with engine.begin() as conn:
        for i, account in enumerate(accounts):
            submit_run(
                conn,
                flow.registry,
                workflow,
                {"account": account},
                key=f"{prefix}{i}",
                namespace="t",
            )


def _set(engine: Engine, *defined: Limit) -> None:
    with engine.begin() as conn:
        for limit in defined:
            limits.save(conn, limit, actor="test", reason="test")


def _plan(engine: Engine) -> FlowPlan:
    with transaction(engine) as conn:
        return make_plan(limits.enabled_limits(conn), read_fleet(conn))


def _claim(engine: Engine, plan: FlowPlan, who: str = "s1", batch: int = 100) -> BudgetedClaim:
    with transaction(engine) as conn:
        return claim_budgeted(conn, plan, locked_by=who, batch=batch)


def _pending(engine: Engine) -> dict[int, tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                steps.c.id,
                steps.c.not_before,
                steps.c.failure_count,
                steps.c.attempt,
                steps.c.updated_at,
            ).where(steps.c.state == "pending")
        )
        return {r.id: tuple(r) for r in rows}


def test_a_rate_admits_its_burst_refills_on_the_database_clock_and_leaves_held_steps_alone(
    engine: Engine,
) -> None:
    _submit(engine, "charge", [f"a{i}" for i in range(30)])
    _set(engine, Limit("pay-rate", "pay", rate=1, burst=3))
    plan = _plan(engine)
    first = _claim(engine, plan)
    assert len(first.claimed) == 3
    assert first.due == pytest.approx(1.0, abs=0.1)  # the next call, a second later
    held_before = _pending(engine)
    again = _claim(engine, plan)
    assert again.claimed == []
    assert _pending(engine) == held_before  # not_before, failures, attempt: untouched
    time.sleep(3.3)  # 3.3 calls' worth: the burst caps it at 3
    refilled = _claim(engine, plan)
    assert len(refilled.claimed) == 3
    assert [c.priority for c in refilled.claimed] == [0, 0, 0]
    with engine.connect() as conn:
        last = conn.execute(text("SELECT last_admitted_at FROM flow_limits")).scalar_one()
    assert last is not None


def test_concurrent_claimers_never_hold_two_steps_of_one_key(engine: Engine) -> None:
    """Three claimers, each in its own connection, on a concurrency-1-per-account limit, each
    finishing its steps a moment after claiming them; a watcher reading committed state never
    sees two steps of one account in processing, and every step is claimed exactly once."""
    accounts = [f"acct-{i % 4}" for i in range(40)]
    _submit(engine, "charge", accounts)
    _set(engine, Limit("per-account", "pay", key=KeyExpr.parse("input.account"), concurrency=1))
    plan = _plan(engine)
    claimed: list[int] = []
    seen_twice: list[Any] = []
    done = threading.Event()
    lock = threading.Lock()

    def claimer(name: str) -> None:
        while not done.is_set():
            got = _claim(engine, plan, who=name, batch=10)
            with lock:
                claimed.extend(c.id for c in got.claimed)
            time.sleep(0.01)
            if got.claimed:
                with engine.begin() as conn:
                    conn.execute(
                        update(steps)
                        .where(steps.c.id.in_([c.id for c in got.claimed]))
                        .values(state="processed", locked_by=None)
                    )
            with lock:
                if len(claimed) >= len(accounts):
                    done.set()

    def watcher() -> None:
        while not done.is_set():
            with engine.connect() as conn:
                seen_twice.extend(
                    conn.execute(
                        text(
                            "SELECT r.input->>'account', count(*) FROM steps s JOIN runs r "
                            "ON r.id = s.run_id WHERE s.state = 'processing' "
                            "GROUP BY 1 HAVING count(*) > 1"
                        )
                    ).all()
                )

    threads = [threading.Thread(target=claimer, args=(f"c{i}",)) for i in range(3)]
    threads.append(threading.Thread(target=watcher))
    for thread in threads:
        thread.start()
    done.wait(30)
    done.set()
    for thread in threads:
        thread.join(10)
    assert seen_twice == []
    assert sorted(claimed) == sorted(set(claimed))
    assert len(claimed) == len(accounts)


def test_concurrent_claimers_share_one_rate(engine: Engine) -> None:
    """Three claimers in separate connections hammer a 50/s limit with burst 5 for 1.5 s: the
    steps they started (dispatched_at, database clock) never exceed burst + rate * elapsed."""
    _submit(engine, "charge", [f"a{i}" for i in range(300)])
    _set(engine, Limit("pay-rate", "pay", rate=50, burst=5))
    plan = _plan(engine)
    stop = time.monotonic() + 1.5

    def claimer(name: str) -> None:
        while time.monotonic() < stop:
            _claim(engine, plan, who=name)

    threads = [threading.Thread(target=claimer, args=(f"c{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    with engine.connect() as conn:
        times = [
            float(t)
            for t in conn.execute(
                text(
                    "SELECT extract(epoch FROM dispatched_at) FROM steps "
                    "WHERE state = 'processing' ORDER BY dispatched_at"
                )
            ).scalars()
        ]
    assert len(times) > 30  # the claimers did get calls through
    for i, started in enumerate(times):
        window = [t for t in times[i:] if t - started <= 1.0]
        assert len(window) <= 5 + 50 * 1.0 + 1, (len(window), started)
    elapsed = times[-1] - times[0]
    assert len(times) <= 5 + 50 * elapsed + 1


def _beat(engine: Engine, **fields: Any) -> None:
    report = InstanceReport(
        instance_id="pay-1",
        agent="pay",
        hostname="h",
        pid=1,
        version="t",
        concurrency=4,
        in_flight=0,
        breakers=fields.pop("breakers", {"gateway": "closed"}),
        interval_s=60,
        actions={"charge": "gateway", "refund": None},
        **fields,
    )
    with engine.begin() as conn:
        record_heartbeats(conn, [report])


def _reasons(engine: Engine) -> dict[int, str]:
    with engine.connect() as conn:
        rows = (
            conn.execute(
                select(
                    steps.c.id,
                    steps.c.run_id,
                    steps.c.agent,
                    steps.c.action,
                    steps.c.state,
                    steps.c.not_before,
                )
            )
            .mappings()
            .all()
        )
        return waiting_reasons(conn, rows)


def test_an_open_breaker_holds_its_dependency_then_lets_one_trial_through(engine: Engine) -> None:
    """A live instance reports the gateway breaker open for 30 s: charges wait (refunds do
    not), saying why; once it reports the trial is due, one charge at a time goes; once it
    reports the breaker closed, charges flow again."""
    _submit(engine, "charge", ["a", "b", "c"], prefix="c")
    _submit(engine, "refund", ["a"], prefix="f")
    _beat(engine, breakers={"gateway": "open"}, breakers_open_for_s={"gateway": 30.0}, seq=1)
    plan = _plan(engine)
    open_claim = _claim(engine, plan)
    assert [c.action for c in open_claim.claimed] == ["refund"]
    assert open_claim.due == pytest.approx(30, abs=2)
    reasons = set(_reasons(engine).values())
    assert len(reasons) == 1
    assert reasons.pop().startswith("breaker open: pay/gateway until ")
    _beat(engine, breakers={"gateway": "open"}, breakers_open_for_s={"gateway": 0.0}, seq=2)
    plan = _plan(engine)
    assert [c.action for c in _claim(engine, plan).claimed] == ["charge"]
    assert _claim(engine, plan).claimed == []  # the trial is in flight: one at a time
    assert set(_reasons(engine).values()) == {"breaker half-open: pay/gateway, one trial at a time"}
    _beat(engine, breakers={"gateway": "closed"}, seq=3)
    assert _plan(engine).agents == frozenset()  # nothing held: the plain claim takes them
    with transaction(engine) as conn:
        assert len(claim_steps(conn, locked_by="s1", batch=100)) == 2


def test_a_dependency_limit_selects_the_actions_the_fleet_reports_using_it(
    engine: Engine,
) -> None:
    _submit(engine, "charge", ["a", "b"], prefix="c")
    _submit(engine, "refund", ["a", "b"], prefix="f")
    _set(engine, Limit("gateway-one", "pay", dependency="gateway", concurrency=1))
    unresolved = _claim(engine, _plan(engine))  # no instance says what uses the gateway yet
    assert len(unresolved.claimed) == 4
    with engine.begin() as conn:
        conn.execute(update(steps).values(state="pending", locked_by=None, attempt=0))
    _beat(engine, seq=1)
    resolved = _claim(engine, _plan(engine))
    assert sorted(c.action for c in resolved.claimed) == ["charge", "refund", "refund"]


def test_held_steps_say_why_they_wait(engine: Engine) -> None:
    _submit(engine, "charge", ["acct-7", "acct-7", "acct-8"], prefix="c")
    _submit(engine, "other", [""], prefix="o")
    _set(
        engine,
        Limit("per-account", "pay", key=KeyExpr.parse("input.account"), concurrency=1),
        Limit("other-rate", "other", rate=0.01, burst=1),
    )
    plan = _plan(engine)
    assert len(_claim(engine, plan).claimed) == 3
    _submit(engine, "other", [""], prefix="o2")
    assert set(_reasons(engine).values()) == {
        "concurrency: per-account 1 at once (key acct-7)",
        "rate-limited: other-rate 36/h",
    }
