"""The paused agents and actions (ops/pause.py), which the schedulers' flow plan reads
(store/flow/plan.py): the claim takes none of their steps."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, and_, delete, insert, select

from sasflow.store.schema import agent_pauses

WHOLE_AGENT = ""
"""The `action` of a pause of the whole agent."""


def find_pause(conn: Connection, agent: str, action: str) -> dict[str, Any] | None:
    row = (
        conn.execute(
            select(agent_pauses).where(
                agent_pauses.c.agent == agent, agent_pauses.c.action == action
            )
        )
        .mappings()
        .first()
    )
    return None if row is None else dict(row)


def add_pause(conn: Connection, agent: str, action: str, *, actor: str, reason: str) -> None:
    conn.execute(
        insert(agent_pauses).values(agent=agent, action=action, paused_by=actor, reason=reason)
    )


def remove_pause(conn: Connection, agent: str, action: str) -> None:
    conn.execute(
        delete(agent_pauses).where(
            and_(agent_pauses.c.agent == agent, agent_pauses.c.action == action)
        )
    )


def all_pauses(conn: Connection) -> list[dict[str, Any]]:
    """Every paused agent and action, by agent then action (the whole agent first)."""
    rows = conn.execute(
        select(agent_pauses).order_by(agent_pauses.c.agent, agent_pauses.c.action)
    ).mappings()
    return [dict(r) for r in rows]
