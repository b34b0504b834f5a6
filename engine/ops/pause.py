"""Operator pause and resume (docs/operations.md): of runs, and of agents or their actions.

A paused run keeps its state; the claim takes none of its steps (store/runs/queries.py,
`claimable_in_run`), so nothing new is dispatched for it, while its steps in flight finish and
their replies are applied: the run advances, and its next steps wait `pending`, their deadlines
not started. Resume clears the flag and wakes the schedulers. Each is an event in the run's
timeline with the actor and the reason.

A paused agent (or some of its actions) is a row the schedulers' flow plan reads
(store/flow/plan.py): the claim takes none of its steps, which stay pending with their
deadlines not started and are never charged. Pause and resume are audited (`agents.pause`,
`agents.resume`) and wake every scheduler, which reads its plan again at once.
"""

from __future__ import annotations

from typing import Any

from sasflow.errors import InvalidActionError
from sasflow.ops.actions import lock_run
from sasflow.ops.reasons import REASON_MAX, has_text
from sasflow.states import TERMINAL_RUN_STATES
from sasflow.store.db import Connection
from sasflow.store.flow import limits
from sasflow.store.flow import pauses as agent_pauses
from sasflow.store.notify import notify_ready
from sasflow.store.operator import pauses as run_pauses
from sasflow.store.operator.audit import AuditRecord, record
from sasflow.store.runs import children, events

NAME_MAX = 100
"""The longest agent or action name the store holds."""


def _check_reason(reason: str) -> None:
    if not has_text(reason) or len(reason) > REASON_MAX:
        raise InvalidActionError(
            f"pausing or resuming needs a reason with text (1 to {REASON_MAX} characters)"
        )


def pause_run(
    conn: Connection, run_id: int, *, actor: str, reason: str, paused: bool = True
) -> dict[str, Any]:
    """Pause the run (`paused` False: resume it) inside the caller's transaction: {run_id,
    state, paused, changed}. Pausing a paused run, or resuming one not paused, changes nothing
    and records nothing (`changed` False); an ended run is refused (nothing is left to hold). Its
    child runs still pending or running are paused (resumed) with it, recursively."""
    _check_reason(reason)
    run = lock_run(conn, run_id)
    verb = "paused" if paused else "resumed"
    if paused and run.state in TERMINAL_RUN_STATES:
        raise InvalidActionError(f"run {run_id} is {run.state}: only a run not ended can be paused")
    changed = run_pauses.set_paused(conn, run_id, paused)
    if changed:
        events.record(
            conn,
            [
                events.Event(
                    run_id=run_id,
                    entity="run",
                    from_state=run.state,
                    to_state=run.state,
                    actor=actor,
                    reason=f"{verb}: {reason}",
                    detail={"paused": paused},
                )
            ],
        )
    # Its children follow (docs/concepts.md, "Child workflows"), and theirs in turn.
    for child in children.active_children(conn, run_id):
        pause_run(conn, child, actor=actor, reason=reason, paused=paused)
    return {"run_id": run_id, "state": str(run.state), "paused": paused, "changed": changed}


def resume_run(conn: Connection, run_id: int, *, actor: str, reason: str) -> dict[str, Any]:
    """Resume the run (see `pause_run`); the caller wakes the schedulers (`wake`)."""
    return pause_run(conn, run_id, actor=actor, reason=reason, paused=False)


def wake(conn: Connection, namespace: str) -> None:
    """Wake every scheduler of the namespace at commit: resumed steps are ready."""
    notify_ready(conn, namespace)


def _check_name(kind: str, name: str) -> None:
    if not name.strip() or len(name) > NAME_MAX or "\x00" in name:
        raise InvalidActionError(f"an {kind} name has 1 to {NAME_MAX} characters")


def pause_agent(
    conn: Connection,
    agent: str,
    *,
    action: str | None = None,
    actor: str,
    reason: str,
    namespace: str,
    paused: bool = True,
) -> dict[str, Any]:
    """Pause the agent, or one `action` of it (`paused` False: resume it): {agent, action,
    paused, changed}. Pausing what is paused (or resuming what is not) changes nothing and is
    not audited. Resuming an action of a paused agent leaves the agent paused."""
    _check_reason(reason)
    _check_name("agent", agent)
    if action is not None:
        _check_name("action", action)
    key = agent_pauses.WHOLE_AGENT if action is None else action
    found = agent_pauses.find_pause(conn, agent, key)
    changed = (found is None) == paused
    if changed:
        if paused:
            agent_pauses.add_pause(conn, agent, key, actor=actor, reason=reason)
        else:
            agent_pauses.remove_pause(conn, agent, key)
        record(
            conn,
            AuditRecord(
                actor=actor,
                action="agents.pause" if paused else "agents.resume",
                reason=reason,
                detail={"agent": agent, "action": action},
            ),
        )
        limits.notify_changed(conn, namespace)  # the schedulers read their plan again
        if not paused:
            notify_ready(conn, namespace)
    return {"agent": agent, "action": action, "paused": paused, "changed": changed}


def resume_agent(
    conn: Connection,
    agent: str,
    *,
    action: str | None = None,
    actor: str,
    reason: str,
    namespace: str,
) -> dict[str, Any]:
    """Resume the agent or its `action` (see `pause_agent`)."""
    return pause_agent(
        conn, agent, action=action, actor=actor, reason=reason, namespace=namespace, paused=False
    )


def paused_agents(conn: Connection) -> list[dict[str, Any]]:
    """Every paused agent and action: {agent, action (None: the whole agent), paused_by,
    reason, paused_at}."""
    return [{**row, "action": row["action"] or None} for row in agent_pauses.all_pauses(conn)]
