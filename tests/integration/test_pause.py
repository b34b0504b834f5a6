"""Pausing runs and agents on PostgreSQL (ops/pause.py): the claim takes none of a paused run's
or a paused agent's (action's) steps, which stay pending with no attempt started and their
clocks untouched; resume lets the claim take them; the timeline and the audit trail say who
and why."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from sasflow import submit_run
from sasflow.errors import InvalidActionError
from sasflow.ops import pause
from sasflow.ops.runs import show_run
from sasflow.store.db import transaction
from sasflow.store.flow import limits
from sasflow.store.flow.claim import claim_budgeted
from sasflow.store.flow.fleet import read_fleet
from sasflow.store.flow.pauses import all_pauses
from sasflow.store.flow.plan import FlowPlan, make_plan
from sasflow.store.runs.claim import claim_steps
from sasflow.store.schema import steps
from tests.apps import flow

pytestmark = pytest.mark.integration


def _submit(engine: Engine, workflow: str, count: int, prefix: str) -> list[int]:
    with engine.begin() as conn:
        return [
            submit_run(
                conn,
                flow.registry,
                workflow,
                {"account": f"a{i}"},
                key=f"{prefix}{i}",
                namespace="t",
            ).run_id
            for i in range(count)
        ]


def _plan(engine: Engine) -> FlowPlan:
    with transaction(engine) as conn:
        return make_plan(limits.enabled_limits(conn), read_fleet(conn), pauses=all_pauses(conn))


def _claim(engine: Engine, plan: FlowPlan | None = None) -> list[int]:
    """One scheduler's claim: the plain claim, then the budgeted one, as dispatch runs them,
    under `plan` (default: read now)."""
    plan = _plan(engine) if plan is None else plan
    with transaction(engine) as conn:
        plain = claim_steps(
            conn, locked_by="s1", batch=100, skip_agents=sorted(plan.agents | plan.paused)
        )
    with transaction(engine) as conn:
        budgeted = claim_budgeted(conn, plan, locked_by="s1", batch=100).claimed
    return sorted(c.run_id for c in plain + budgeted)


def _pending(engine: Engine) -> dict[int, tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                steps.c.run_id,
                steps.c.attempt,
                steps.c.not_before,
                steps.c.failure_count,
                steps.c.dispatched_at,
                steps.c.complete_by,
            ).where(steps.c.state == "pending")
        )
        return {r.run_id: tuple(r) for r in rows}


def test_a_paused_runs_steps_are_not_claimed_until_it_is_resumed(engine: Engine) -> None:
    run_ids = _submit(engine, "other", 3, "r")
    with engine.begin() as conn:
        paused = pause.pause_run(conn, run_ids[1], actor="ann", reason="customer asked")
    assert paused == {"run_id": run_ids[1], "state": "pending", "paused": True, "changed": True}
    before = _pending(engine)[run_ids[1]]
    assert _claim(engine) == [run_ids[0], run_ids[2]]
    assert _pending(engine) == {run_ids[1]: before}  # no attempt, no deadline, not charged
    with engine.begin() as conn:
        again = pause.pause_run(conn, run_ids[1], actor="ann", reason="twice")
        assert again["changed"] is False
        resumed = pause.resume_run(conn, run_ids[1], actor="bob", reason="done checking")
    assert resumed["changed"] is True
    assert _claim(engine) == [run_ids[1]]
    with engine.connect() as conn:
        timeline = [
            (e["actor"], e["reason"], e["detail"])
            for e in show_run(conn, run_ids[1])["events"]
            if e["entity"] == "run" and "paused" in (e["detail"] or {})
        ]
    assert timeline == [
        ("ann", "paused: customer asked", {"paused": True}),
        ("bob", "resumed: done checking", {"paused": False}),
    ]


def test_an_ended_run_cannot_be_paused_and_a_reason_is_required(engine: Engine) -> None:
    (run_id,) = _submit(engine, "other", 1, "e")
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET state = 'completed' WHERE id = :id"), {"id": run_id})
    with engine.begin() as conn, pytest.raises(InvalidActionError, match="is completed"):
        pause.pause_run(conn, run_id, actor="ann", reason="late")
    with engine.begin() as conn, pytest.raises(InvalidActionError, match="reason"):
        pause.resume_run(conn, run_id, actor="ann", reason="  ")


def test_a_paused_agent_gets_no_step_and_resume_lets_the_claim_take_them(engine: Engine) -> None:
    charges = _submit(engine, "charge", 2, "c")
    others = _submit(engine, "other", 2, "o")
    with engine.begin() as conn:
        done = pause.pause_agent(
            conn, "pay", actor="ann", reason="gateway maintenance", namespace="t"
        )
    assert done["changed"] is True
    held = _pending(engine)
    assert _claim(engine) == others
    assert _pending(engine) == {r: held[r] for r in charges}
    with engine.connect() as conn:
        assert (
            show_run(conn, charges[0])["steps"][0]["waiting"] == "agent pay paused by an operator"
        )
        assert pause.paused_agents(conn)[0]["paused_by"] == "ann"
    with engine.begin() as conn:
        pause.resume_agent(conn, "pay", actor="bob", reason="maintenance over", namespace="t")
    assert _claim(engine) == charges
    with engine.connect() as conn:
        audit = conn.execute(text("SELECT actor, action, reason FROM audit ORDER BY id")).all()
    assert [tuple(a) for a in audit] == [
        ("ann", "agents.pause", "gateway maintenance"),
        ("bob", "agents.resume", "maintenance over"),
    ]


def test_a_paused_action_holds_only_its_steps(engine: Engine) -> None:
    charges = _submit(engine, "charge", 2, "c")
    refunds = _submit(engine, "refund", 2, "f")
    with engine.begin() as conn:
        pause.pause_agent(
            conn, "pay", action="charge", actor="ann", reason="bad deploy", namespace="t"
        )
    held = _pending(engine)
    assert _claim(engine) == refunds
    assert _pending(engine) == {r: held[r] for r in charges}
    with engine.connect() as conn:
        assert show_run(conn, charges[0])["steps"][0]["waiting"] == (
            "pay charge paused by an operator"
        )
    with engine.begin() as conn:
        pause.resume_agent(conn, "pay", action="charge", actor="ann", reason="fixed", namespace="t")
    assert _claim(engine) == charges


@pytest.mark.parametrize("action", [None, "charge"])
def test_a_pause_holds_from_its_commit_though_the_schedulers_plan_predates_it(
    engine: Engine, action: str | None
) -> None:
    """A scheduler reads the pauses into its flow plan when notified: until it has, its claim
    still must not take a paused agent's (action's) step. Without the claim's own check, a run
    submitted right after the pause was dispatched (the console test that caught it)."""
    charges = _submit(engine, "charge", 2, "c")
    others = _submit(engine, "other", 1, "o")
    stale = _plan(engine)
    with engine.begin() as conn:
        pause.pause_agent(conn, "pay", action=action, actor="ann", reason="x", namespace="t")
    assert _claim(engine, stale) == others
    with engine.begin() as conn:
        pause.resume_agent(conn, "pay", action=action, actor="ann", reason="y", namespace="t")
    assert _claim(engine, stale) == charges
