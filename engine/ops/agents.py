"""The fleet view: every agent instance with its last heartbeat (the function behind
`sasflow agents list`)."""

from __future__ import annotations

from typing import Any

from sasflow.states import LOST_AFTER_MISSED, AgentState
from sasflow.store.cluster import fleet
from sasflow.store.db import Connection


def list_agents(
    conn: Connection, *, agent: str | None = None, include_stopped: bool = False
) -> list[dict[str, Any]]:
    """Agent instances by agent and host: live and lost ones, stopped ones too when asked.

    A live instance that missed LOST_AFTER_MISSED heartbeats is shown `lost` at once (on the
    database clock), before the supervisor's next pass records it and raises the alert."""
    found = fleet.find_instances(conn, agent=agent, include_gone=include_stopped)
    for instance in found:
        overdue = instance["seconds_since_heartbeat"] > LOST_AFTER_MISSED * instance["interval_s"]
        if instance["state"] == AgentState.LIVE and overdue:
            instance["state"] = AgentState.LOST
        held, concurrency = instance.get("held", 0), instance["concurrency"]
        instance["wedged"] = (
            instance["state"] == AgentState.LIVE and concurrency > 0 and held >= concurrency
        )
        instance["status"] = status_text(instance)
    return found


def status_text(instance: dict[str, Any]) -> str:
    """The instance's state as operators read it: `wedged, 2 held past deadline` when every
    worker thread is held by a handler past its deadline (sasflow.agents.wedge)."""
    held = instance.get("held", 0)
    if instance["state"] != AgentState.LIVE or not held:
        return str(instance["state"])
    state = "wedged" if instance["wedged"] else str(instance["state"])
    return f"{state}, {held} held past deadline"
