"""The broker's outage as one alert (docs/backpressure.md#a-broker-outage-is-one-alert).

When the supervisor cannot reach the broker, every agent looks out at once: their heartbeats
travel through the broker, so none is heard of, and nobody can be asked for consumers. One
`agent_outage` per agent would bury the cause under its effects. Instead, while the broker does
not answer and work waits for an agent nobody has heard of, the supervisor raises **one**
`broker_outage` alert naming the agents and their waiting steps, and raises no `agent_outage`
of its own (those already open stay open). When the broker answers again the alert is resolved,
and every agent's outage is timed from that moment: agents get `outage_after` seconds to
reconnect and heartbeat before one of them is called out.

The outage started at the earliest of when this supervisor first failed to reach the broker and
when any waiting agent was last heard of (a supervisor run from cron remembers nothing between
runs), and never before the broker was last back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sasflow.store.db import Connection
from sasflow.store.operator.audit import database_now
from sasflow.store.outbox.alerts import BROKER_OUTAGE, Alert, raise_alert, resolve_open

log = logging.getLogger(__name__)

SUBJECT = "broker"
"""The one broker_outage alert's subject: one broker (or cluster) per deployment."""


class Waiting(Protocol):
    """What the broker decision reads of an agent (supervisor.outage.AgentView)."""

    @property
    def agent(self) -> str: ...
    @property
    def steps(self) -> int: ...
    @property
    def live(self) -> int: ...
    @property
    def last_heard(self) -> datetime | None: ...


class Previous(Protocol):
    """The newest `broker_outage` alert (supervisor.outage.LastAlert)."""

    @property
    def open(self) -> bool: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def back_at(self) -> datetime | None:
        """When the supervisor saw the broker back and resolved it; None: still open, or
        acknowledged by an operator while the outage lasted."""


@dataclass(frozen=True)
class BrokerOutage:
    since: datetime
    error: str
    agents: dict[str, int]
    """The agents nobody has heard of, with the steps waiting for each."""


def stranded(views: Iterable[Waiting]) -> dict[str, int]:
    """Agents with work waiting and no live instance: what a broker outage strands."""
    return {v.agent: v.steps for v in views if v.steps > 0 and v.live == 0}


def outage_since(
    views: Sequence[Waiting], first_failed: datetime, previous: Previous | None
) -> datetime:
    """When the broker's outage began: the earlier of this supervisor's first failure and
    the last word from any stranded agent, never before the broker was last back."""
    heard = [v.last_heard for v in views if v.steps > 0 and v.live == 0 and v.last_heard]
    since = min([first_failed, max(heard)]) if heard else first_failed
    if previous is not None and previous.back_at is not None:
        since = max(since, previous.back_at)
    return since


def decide_raise(
    views: Sequence[Waiting],
    *,
    error: str,
    first_failed: datetime,
    previous: Previous | None,
    db_now: datetime,
    after_s: float,
) -> BrokerOutage | None:
    """The outage to raise: the broker unreachable for `after_s` seconds while work waits for
    an agent nobody has heard of, none open, this outage not acknowledged by an operator."""
    agents = stranded(views)
    if not agents:
        return None
    since = outage_since(views, first_failed, previous)
    if previous is not None:
        if previous.open:
            return None
        if previous.back_at is None and previous.created_at >= since:
            return None  # this outage, acknowledged by an operator
    if (db_now - since).total_seconds() < after_s:
        return None
    return BrokerOutage(since=since, error=error, agents=agents)


def raise_outage(conn: Connection, outage: BrokerOutage, *, actor: str) -> int | None:
    steps = sum(outage.agents.values())
    names = ", ".join(sorted(outage.agents))
    message = (
        f"the broker has not answered since {outage.since.isoformat()} ({outage.error}); "
        f"{steps} step(s) wait for agent(s) nobody has heard of since: {names}. "
        "Agent outages are not raised separately while it lasts."
    )
    alert = Alert(
        BROKER_OUTAGE,
        SUBJECT,
        message,
        detail={
            "since": outage.since.isoformat(),
            "error": outage.error,
            "steps": steps,
            "agents": dict(sorted(outage.agents.items())),
            "reported_by": actor,
        },
    )
    alert_id = raise_alert(conn, alert)
    if alert_id is not None:
        log.warning("%s", message)
    return alert_id


def resolve_outage(conn: Connection, detail: object, *, actor: str) -> datetime | None:
    """Close the open broker_outage (the broker answers); returns when, None if none was open."""
    db_now = database_now(conn)
    before = dict(detail) if isinstance(detail, dict) else {}
    since = before.get("since")
    lasted = ""
    if isinstance(since, str):
        lasted = f" after {(db_now - datetime.fromisoformat(since)).total_seconds():.0f}s"
    reason = f"the broker answers again{lasted}"
    key = Alert(BROKER_OUTAGE, SUBJECT, "").dedup_key
    resolved = {**before, "back_at": db_now.isoformat()}
    if not resolve_open(conn, key, actor=actor, reason=reason, detail=resolved):
        return None
    log.info("broker outage over: %s", reason)
    return db_now
