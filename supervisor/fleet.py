"""The supervisor's fleet pass: agent instances that stopped heartbeating become `lost`; gone
instances and idle flow-limit buckets are forgotten.

The supervisor judges loss because it is the one role that acts alone (under its lease) and
periodically: each lost instance is marked once, appends one fleet event (entity "agent") to
the history and, while other instances of its agent live, raises one `agent_lost` alert
(deduplicated per instance), in one transaction. When the last live instance of an agent is
lost (all at once in a broker outage, or one after the other), no `agent_lost` is raised for
it: the agent is out, and the outage watch (supervisor.outage) raises one `agent_outage` for
the agent if work waits for it.
"""

from __future__ import annotations

import logging

from sasflow.states import LOST_AFTER_MISSED, AgentState
from sasflow.store.cluster import fleet
from sasflow.store.cluster.lease import Lease
from sasflow.store.db import Engine, transaction
from sasflow.store.flow import limits as flow_limits
from sasflow.store.outbox import stream
from sasflow.store.outbox.alerts import AGENT_LOST, Alert, raise_alert
from sasflow.store.runs import events
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
