"""The supervisor's outage watch: one `agent_outage` alert per agent that has work waiting and
nobody serving it for `outage_after` seconds, resolved when the agent is back
(docs/backpressure.md#the-outage-alert).

Who serves an agent: the broker knows best (consumers on the agent's queue), and answers for
agents that send no heartbeat (another language's); when the broker cannot be asked, the fleet
view does (live instances). The outage started when the agent was last heard of (its latest
heartbeat, database clock) when no instance lives; when instances live but nothing consumes
(a consumer the broker cancelled), when this supervisor first saw the queue without consumer.
One alert per agent, deduplicated while open; an outage an operator acknowledged is not raised
again while it lasts. It is resolved (acknowledged by the supervisor, with how long it lasted)
once the agent is back, whether or not work still waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from sasflow.store.cluster import fleet
from sasflow.store.cluster.lease import Lease
from sasflow.store.db import Connection, Engine, transaction
from sasflow.store.operator.audit import database_now
from sasflow.store.outbox.alerts import (
    AGENT_OUTAGE,
    Alert,
    open_alerts,
    raise_alert,
    raised_since,
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
    open_outages: Iterable[str],
    noticed: Mapping[str, datetime],
    db_now: datetime,
    after_s: float,
) -> Decision:
    """Which agents to alert about (out, with work waiting, for `after_s` seconds, none
    open yet) and which open outages are over (the agent is back)."""
    opened = set(open_outages)
    decision = Decision()
    for view in views:
        if view.agent in opened:
            if not view.out:
                decision.resolve.append(view)
            continue
        if view.steps == 0:
            continue
        since = outage_start(view, noticed.get(view.agent, db_now))
        if since is not None and (db_now - since).total_seconds() >= after_s:
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
            work = waiting_work(conn)
            opened = {
                r.dedup_key.split(":", 1)[1]: _since(r.detail)
                for r in open_alerts(conn, AGENT_OUTAGE)
            }
            agents = sorted(set(work) | set(opened))
            presence = fleet.presence(conn, agents)
            db_now = database_now(conn)
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
            views, open_outages=opened, noticed=self._noticed, db_now=db_now, after_s=self.after_s
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
                _resolve(conn, view, actor=actor, db_now=db_now, since=opened.get(view.agent))


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
    if raised_since(conn, alert, outage.since):
        return None  # this outage was alerted already (an operator acknowledged it)
    alert_id = raise_alert(conn, alert)
    if alert_id is not None:
        log.warning("%s", message)
    return alert_id


def _since(detail: object) -> datetime | None:
    """The outage start an open alert's detail records (None if unreadable)."""
    if isinstance(detail, dict) and isinstance(detail.get("since"), str):
        try:
            return datetime.fromisoformat(detail["since"])
        except ValueError:
            return None
    return None


def _resolve(
    conn: Connection, view: AgentView, *, actor: str, db_now: datetime, since: datetime | None
) -> None:
    consumers = "unknown" if view.consumers is None else str(view.consumers)
    lasted = "" if since is None else f" after {(db_now - since).total_seconds():.0f}s"
    reason = (
        f"agent {view.agent!r} is back{lasted}: {view.live} live instance(s), "
        f"{consumers} consumer(s); {view.steps} step(s) waiting"
    )
    if resolve_open(
        conn, Alert(AGENT_OUTAGE, view.agent, "").dedup_key, actor=actor, reason=reason
    ):
        log.info("outage over: %s", reason)
