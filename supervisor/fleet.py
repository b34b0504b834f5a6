"""The supervisor's fleet pass: agent instances that stopped heartbeating become `lost`; gone
instances and idle flow-limit buckets are forgotten.

The supervisor judges loss because it is the one role that acts alone (under its lease) and
periodically: each lost instance is marked once, raises one `agent_lost` alert (deduplicated
per instance) and appends one fleet event (entity "agent") to the history, in one transaction.
"""

from __future__ import annotations

from sasflow.states import LOST_AFTER_MISSED, AgentState
from sasflow.store.cluster import fleet
from sasflow.store.cluster.lease import Lease
from sasflow.store.db import Engine, transaction
from sasflow.store.flow import limits as flow_limits
from sasflow.store.outbox import stream
from sasflow.store.outbox.alerts import AGENT_LOST, Alert, raise_alert
from sasflow.store.runs import events
from sasflow.store.runs.sweeps import SweepReport

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
            alert_id = raise_alert(conn, Alert(AGENT_LOST, row.instance_id, message, detail=detail))
            if alert_id is not None:
                report.alerts.append(alert_id)
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
