"""The supervisor's fleet pass: agent instances that stopped heartbeating become `lost`; gone
instances and idle flow-limit buckets are forgotten.

The supervisor judges loss because it is the one role that acts alone (under its lease) and
periodically: each lost instance is marked once, appends one fleet event (entity "agent") to
the history and, while other instances of its agent live, raises one `agent_lost` alert
(deduplicated per instance), in one transaction. When the last live instance of an agent is
lost (all at once in a broker outage, or one after the other), no `agent_lost` is raised for
it: the agent is out, and the outage watch (supervisor.outage) raises one `agent_outage` for
the agent if work waits for it.

A live instance whose heartbeat says every worker thread is held by a handler past its
deadline (sasflow.agents.wedge) raises one `agent_wedged` alert (deduplicated per instance).

Steps of an action deferred for a while (`outage_after`) while every live instance of their
agent reports actions without it raise one `action_missing` alert per agent and action: the
instances hand such requests back and defer them instead of failing them (agents.handback), so
without the alert the steps would only wait, until their give-up age.
"""

from __future__ import annotations

import logging

from sasflow.states import LOST_AFTER_MISSED, AgentState
from sasflow.store.cluster import fleet
from sasflow.store.cluster.lease import Lease
from sasflow.store.db import Engine, transaction
from sasflow.store.flow import limits as flow_limits
from sasflow.store.outbox import stream
from sasflow.store.outbox.alerts import (
    ACTION_MISSING,
    AGENT_LOST,
    AGENT_WEDGED,
    Alert,
    raise_alert,
)
from sasflow.store.runs import events, waiting
from sasflow.store.runs.sweeps import SweepReport

log = logging.getLogger(__name__)

FORGET_AFTER_S = 7 * 86400.0
"""Seconds a stopped or lost instance stays in the fleet view before it is deleted."""


def flag_lost_agents(
    engine: Engine, lease: Lease, *, actor: str, namespace: str, report: SweepReport
) -> None:
    """Mark lost the instances that missed LOST_AFTER_MISSED heartbeats; alert, record each, and
    tell the subscription streams (a FAILURE record)."""
    with transaction(engine) as conn:
        lease.check(conn)
        lost = fleet.mark_lost(conn)
        left = fleet.presence(conn, sorted({row.agent for row in lost}))
        batch = []
        for row in lost:
            message = (
                f"agent {row.agent!r} instance {row.instance_id} on {row.hostname} (pid "
                f"{row.pid}) missed {LOST_AFTER_MISSED} heartbeats; its last was at "
                f"{row.heartbeat_at.isoformat()} with {row.in_flight} step(s) in flight"
            )
            detail = {
                "agent": row.agent,
                "instance_id": row.instance_id,
                "hostname": row.hostname,
                "pid": row.pid,
                "last_heartbeat": row.heartbeat_at.isoformat(),
                "in_flight": row.in_flight,
                "reported_by": actor,
            }
            if left[row.agent].live:
                alert = Alert(AGENT_LOST, row.instance_id, message, detail=detail)
                alert_id = raise_alert(conn, alert)
                if alert_id is not None:
                    report.alerts.append(alert_id)
            else:
                log.info("%s; no instance of %r is live: no agent_lost alert", message, row.agent)
            batch.append(
                events.Event(
                    run_id=None,
                    entity="agent",
                    from_state=AgentState.LIVE,
                    to_state=AgentState.LOST,
                    actor=actor,
                    reason=message,
                    detail=detail,
                )
            )
        events.record(conn, batch)
        failures = [{"type": "FAILURE", **(e.detail or {})} for e in batch]
        stream.queue_failures(conn, failures, namespace=namespace)
        report.agents_lost += len(lost)
        fleet.forget_gone(conn, after_s=FORGET_AFTER_S)
        # Idle rate buckets hold a full burst, as no row does: keys no longer used go.
        flow_limits.forget_idle_buckets(conn)


def flag_wedged_agents(engine: Engine, lease: Lease, *, actor: str, report: SweepReport) -> None:
    """Raise one `agent_wedged` alert per wedged live instance (deduplicated while open)."""
    with transaction(engine) as conn:
        lease.check(conn)
        for row in fleet.wedged_instances(conn):
            message = (
                f"agent {row.agent!r} instance {row.instance_id} on {row.hostname} (pid "
                f"{row.pid}) is wedged: all {row.concurrency} worker thread(s) held by handlers "
                "past their deadline; it takes no requests, and exits for a restart past its "
                "bound (--wedged-exit)"
            )
            detail = {
                "agent": row.agent,
                "instance_id": row.instance_id,
                "hostname": row.hostname,
                "pid": row.pid,
                "held": row.held,
                "concurrency": row.concurrency,
                "last_heartbeat": row.heartbeat_at.isoformat(),
                "reported_by": actor,
            }
            alert_id = raise_alert(
                conn, Alert(AGENT_WEDGED, row.instance_id, message, detail=detail)
            )
            if alert_id is not None:
                log.warning("%s", message)
                report.alerts.append(alert_id)


def flag_missing_actions(
    engine: Engine, lease: Lease, *, actor: str, after_s: float, report: SweepReport
) -> None:
    """Raise one `action_missing` alert per (agent, action) whose steps were deferred for
    `after_s` seconds while no live instance of the agent has the action (instances that do
    not report their actions, or none live, raise nothing: that is not known, or an outage)."""
    with transaction(engine) as conn:
        lease.check(conn)
        deferred = waiting.deferred_actions(conn, for_s=after_s)
        if not deferred:
            return
        live: dict[str, list[dict[str, object]]] = {}
        for instance in fleet.find_instances(conn, agent=None, include_gone=False):
            if instance["state"] == AgentState.LIVE:
                live.setdefault(str(instance["agent"]), []).append(instance)
        for found in deferred:
            instances = live.get(found.agent, [])
            reported = [i["actions"] for i in instances]
            if not instances or any(not isinstance(a, dict) for a in reported):
                continue
            if any(found.action in a for a in reported if isinstance(a, dict)):
                continue  # one has it: busy, or the deferral is a breaker's
            has = "; ".join(
                f"{i['instance_id']} has {', '.join(sorted(a)) or 'none'}"
                for i in instances
                if isinstance(a := i["actions"], dict)
            )
            message = (
                f"no instance of agent {found.agent!r} has action {found.action!r} "
                f"(instances: {has}); {found.steps} step(s) deferred since "
                f"{found.since.isoformat()}"
            )
            detail = {
                "agent": found.agent,
                "action": found.action,
                "steps": found.steps,
                "since": found.since.isoformat(),
                "instances": [str(i["instance_id"]) for i in instances],
                "reported_by": actor,
            }
            subject = f"{found.agent}/{found.action}"
            alert_id = raise_alert(conn, Alert(ACTION_MISSING, subject, message, detail=detail))
            if alert_id is not None:
                log.warning("%s", message)
                report.alerts.append(alert_id)
