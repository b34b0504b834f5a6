"""The supervisor's outage watch: one `agent_outage` alert per agent that has work waiting and
nobody serving it for `outage_after` seconds, resolved when the agent is back
(docs/backpressure.md#the-outage-alert).

Who serves an agent: the broker knows best (consumers on the agent's queue), and answers for
agents that send no heartbeat (another language's); when the broker cannot be asked, the fleet
view does (live instances). The outage started when the agent was last heard of (its latest
heartbeat, database clock) when no instance lives; when instances live but nothing consumes
(a consumer the broker cancelled), when this supervisor first saw the queue without consumer;
and never before the agent was last back (the end of its previous outage). One alert per
agent, deduplicated while open; an outage an operator acknowledged is not raised again while
it lasts. It is resolved (acknowledged by the supervisor, `back_at` added to its detail) once
the agent is back, whether or not work still waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sasflow.store.cluster import fleet
from sasflow.store.cluster.lease import Lease
from sasflow.store.db import Connection, Engine, transaction
from sasflow.store.operator.audit import database_now
from sasflow.store.outbox.alerts import (
    AGENT_OUTAGE,
    Alert,
    latest_alert,
    open_alerts,
    raise_alert,
    resolve_open,
)
from sasflow.store.runs.sweeps import SweepReport
from sasflow.store.runs.waiting import waiting_work

log = logging.getLogger(__name__)

DEFAULT_OUTAGE_AFTER_S = 30.0
"""Seconds an agent may have work waiting and nobody serving it before the alert."""


@dataclass(frozen=True)
class AgentView:
    """One agent as the watch sees it: the work waiting, the fleet view and the broker's."""

    agent: str
    pending: int
    processing: int
    oldest_waiting: datetime | None
    live: int
    last_heard: datetime | None
    consumers: int | None
    """Consumers on its queue; None when the broker could not be asked."""

    @property
    def steps(self) -> int:
        return self.pending + self.processing

    @property
    def out(self) -> bool:
        """Nobody serves it: no consumer (the broker's word), else no live instance."""
        if self.consumers is not None:
            return self.consumers == 0
        return self.live == 0


@dataclass(frozen=True)
class LastAlert:
    """The newest `agent_outage` alert of an agent."""

    open: bool
    created_at: datetime
    back_at: datetime | None
    """When the supervisor saw the agent back and resolved it; None: still open, or
    acknowledged by an operator while the outage lasted."""


def outage_start(view: AgentView, noticed: datetime) -> datetime | None:
    """When `view`'s outage began (None: it is not out). No live instance: when it was last
    heard of, else (never seen) when its oldest waiting step began to wait; instances live but
    nobody consumes: `noticed` (when this supervisor first saw it so)."""
    if not view.out:
        return None
    if view.live == 0:
        return view.last_heard or view.oldest_waiting or noticed
    return noticed


@dataclass(frozen=True)
class Outage:
    """An outage to raise an alert for."""

    view: AgentView
    since: datetime


@dataclass(frozen=True)
class Decision:
    raise_: list[Outage] = field(default_factory=list)
    resolve: list[AgentView] = field(default_factory=list)


def decide(
    views: Iterable[AgentView],
    *,
    last: Mapping[str, LastAlert],
    noticed: Mapping[str, datetime],
    db_now: datetime,
    after_s: float,
) -> Decision:
    """Which agents to alert about (out, with work waiting, for `after_s` seconds, none open,
    this outage not acknowledged by an operator) and which open outages are over (the agent
    is back)."""
    decision = Decision()
    for view in views:
        previous = last.get(view.agent)
        if previous is not None and previous.open:
            if not view.out:
                decision.resolve.append(view)
            continue
        if view.steps == 0:
            continue
        since = outage_start(view, noticed.get(view.agent, db_now))
        if since is None:
            continue
        if previous is not None:
            if previous.back_at is not None:
                since = max(since, previous.back_at)  # it was back since then
            elif previous.created_at >= since:
                continue  # this outage, acknowledged by an operator
        if (db_now - since).total_seconds() >= after_s:
            decision.raise_.append(Outage(view, since))
    return decision


ConsumerCounts = Callable[[list[str]], dict[str, int] | None]
"""The consumers of each agent's queue, or None when the broker cannot be asked."""


class OutageWatch:
    """The supervisor's memory between sweeps: when it first saw each agent's queue without
    consumer while instances lived (lost on a restart: the alert then waits `after_s` more)."""

    def __init__(self, *, after_s: float = DEFAULT_OUTAGE_AFTER_S) -> None:
        self.after_s = after_s
        self._noticed: dict[str, datetime] = {}

    def check(
        self,
        engine: Engine,
        lease: Lease,
        consumers: ConsumerCounts,
        *,
        actor: str,
        queue_of: Callable[[str], str],
        report: SweepReport,
    ) -> None:
        """Read what waits and who serves it, ask the broker, then raise and resolve."""
        with transaction(engine) as conn:
            db_now = database_now(conn)
            work = waiting_work(conn)
            opened = {r.dedup_key.split(":", 1)[1]: r for r in open_alerts(conn, AGENT_OUTAGE)}
            agents = sorted(set(work) | set(opened))
            presence = fleet.presence(conn, agents)
            last: dict[str, LastAlert] = {
                a: LastAlert(open=True, created_at=r.created_at, back_at=None)
                for a, r in opened.items()
            }
            for agent in set(work) - set(opened):
                found = _last(conn, agent)
                if found is not None:
                    last[agent] = found
        if not agents:
            self._noticed.clear()
            return
        counts = consumers(agents)
        views = [
            AgentView(
                agent=agent,
                pending=work[agent].pending if agent in work else 0,
                processing=work[agent].processing if agent in work else 0,
                oldest_waiting=work[agent].oldest if agent in work else None,
                live=presence[agent].live,
                last_heard=presence[agent].last_heard,
                consumers=None if counts is None else counts.get(agent),
            )
            for agent in agents
        ]
        for view in views:
            if view.out and view.live > 0:
                self._noticed.setdefault(view.agent, db_now)
            else:
                self._noticed.pop(view.agent, None)
        decision = decide(
            views,
            last=last,
            noticed=self._noticed,
            db_now=db_now,
            after_s=self.after_s,
        )
        if not (decision.raise_ or decision.resolve):
            return
        with transaction(engine) as conn:
            lease.check(conn)
            for outage in decision.raise_:
                alert_id = _raise(conn, outage, actor=actor, queue=queue_of(outage.view.agent))
                if alert_id is not None:
                    report.alerts.append(alert_id)
            for view in decision.resolve:
                _resolve(conn, view, actor=actor, detail=opened[view.agent].detail)


def _last(conn: Connection, agent: str) -> LastAlert | None:
    row = latest_alert(conn, AGENT_OUTAGE, agent)
    if row is None:
        return None
    back = row.detail.get("back_at") if isinstance(row.detail, dict) else None
    return LastAlert(
        open=not row.acknowledged,
        created_at=row.created_at,
        back_at=datetime.fromisoformat(back) if isinstance(back, str) else None,
    )


def _raise(conn: Connection, outage: Outage, *, actor: str, queue: str) -> int | None:
    view = outage.view
    if view.consumers is None:
        serving = "no live instance (the broker could not be asked for consumers)"
    elif view.live:
        serving = f"no consumer on {queue}, though {view.live} instance(s) heartbeat"
    else:
        serving = f"no consumer on {queue} and no live instance"
    message = (
        f"agent {view.agent!r} has had {serving} since {outage.since.isoformat()}; "
        f"{view.steps} step(s) wait for it ({view.pending} ready, {view.processing} "
        "dispatched and unanswered): is it running?"
    )
    alert = Alert(
        AGENT_OUTAGE,
        view.agent,
        message,
        detail={
            "agent": view.agent,
            "steps": view.steps,
            "pending": view.pending,
            "processing": view.processing,
            "since": outage.since.isoformat(),
            "live_instances": view.live,
            "consumers": view.consumers,
            "queue": queue,
            "reported_by": actor,
        },
    )
    alert_id = raise_alert(conn, alert)
    if alert_id is not None:
        log.warning("%s", message)
    return alert_id


def _resolve(conn: Connection, view: AgentView, *, actor: str, detail: Any) -> None:
    db_now = database_now(conn)
    before = dict(detail) if isinstance(detail, dict) else {}
    since = before.get("since")
    lasted = ""
    if isinstance(since, str):
        lasted = f" after {(db_now - datetime.fromisoformat(since)).total_seconds():.0f}s"
    consumers = "unknown" if view.consumers is None else str(view.consumers)
    reason = (
        f"agent {view.agent!r} is back{lasted}: {view.live} live instance(s), "
        f"{consumers} consumer(s); {view.steps} step(s) waiting"
    )
    key = Alert(AGENT_OUTAGE, view.agent, "").dedup_key
    resolved = {**before, "back_at": db_now.isoformat()}
    if resolve_open(conn, key, actor=actor, reason=reason, detail=resolved):
        log.info("outage over: %s", reason)
