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

When the broker itself cannot be reached, one `broker_outage` alert takes the place of the
agents' (supervisor.broker_outage), and once it answers again every agent's outage is timed
from that moment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sasflow.errors import BrokerUnavailableError
from sasflow.store.cluster import fleet
from sasflow.store.cluster.lease import Lease
from sasflow.store.db import Connection, Engine, transaction
from sasflow.store.operator.audit import database_now
from sasflow.store.outbox.alerts import (
    AGENT_OUTAGE,
    BROKER_OUTAGE,
    Alert,
    latest_alert,
    open_alerts,
    raise_alert,
    resolve_open,
)
from sasflow.store.runs.sweeps import SweepReport
from sasflow.store.runs.waiting import waiting_work
from sasflow.supervisor import broker_outage

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
    """The newest `agent_outage` alert of an agent (or `broker_outage` alert)."""

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
    floor: datetime | None = None,
) -> Decision:
    """Which agents to alert about (out, with work waiting, for `after_s` seconds, none open,
    this outage not acknowledged by an operator) and which open outages are over (the agent
    is back). No outage is timed from before `floor` (when the broker was last back)."""
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
        if floor is not None:
            since = max(since, floor)
        if previous is not None:
            if previous.back_at is not None:
                since = max(since, previous.back_at)  # it was back since then
            elif previous.created_at >= since:
                continue  # this outage, acknowledged by an operator
        if (db_now - since).total_seconds() >= after_s:
            decision.raise_.append(Outage(view, since))
    return decision


ConsumerCounts = Callable[[list[str]], dict[str, int] | None]
"""The consumers of each agent's queue, or None when there is no broker to ask; raises
BrokerUnavailableError when the broker cannot be reached."""


class OutageWatch:
    """The supervisor's memory between sweeps: when it first saw each agent's queue without
    consumer while instances lived (lost on a restart: the alert then waits `after_s` more)."""

    def __init__(self, *, after_s: float = DEFAULT_OUTAGE_AFTER_S) -> None:
        self.after_s = after_s
        self._noticed: dict[str, datetime] = {}
        self._broker_failed: datetime | None = None
        """When this supervisor first failed to reach the broker, in the current outage."""

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
        seen = _read(engine)
        if not seen.agents and not seen.broker_open:
            self._noticed.clear()
            self._broker_failed = None
            return
        broker_error: str | None = None
        try:
            counts = consumers(seen.agents)
        except BrokerUnavailableError as exc:
            counts, broker_error = None, str(exc)
        views = seen.views(counts)
        for view in views:
            if view.out and view.live > 0:
                self._noticed.setdefault(view.agent, seen.db_now)
            else:
                self._noticed.pop(view.agent, None)
        broker_raise, floor = self._broker(
            engine, lease, seen, views, error=broker_error, actor=actor
        )
        decision = decide(
            views,
            last=seen.last,
            noticed=self._noticed,
            db_now=seen.db_now,
            after_s=self.after_s,
            floor=floor,
        )
        if broker_error is not None:
            decision.raise_.clear()  # the broker's outage explains them: one alert says it
        if not (decision.raise_ or decision.resolve or broker_raise):
            return
        with transaction(engine) as conn:
            lease.check(conn)
            raised = [
                _raise(conn, outage, actor=actor, queue=queue_of(outage.view.agent))
                for outage in decision.raise_
            ]
            if broker_raise is not None:
                raised.insert(0, broker_outage.raise_outage(conn, broker_raise, actor=actor))
            for view in decision.resolve:
                _resolve(conn, view, actor=actor, detail=seen.opened[view.agent].detail)
        report.alerts.extend(alert_id for alert_id in raised if alert_id is not None)

    def _broker(
        self,
        engine: Engine,
        lease: Lease,
        seen: _Seen,
        views: list[AgentView],
        *,
        error: str | None,
        actor: str,
    ) -> tuple[broker_outage.BrokerOutage | None, datetime | None]:
        """The broker's outage to raise (it does not answer), or the open one resolved (it
        answers again); and the floor of the agents' outages: when the broker was last back."""
        floor = seen.broker_last.back_at if seen.broker_last is not None else None
        if error is not None:
            self._broker_failed = self._broker_failed or seen.db_now
            outage = broker_outage.decide_raise(
                views,
                error=error,
                first_failed=self._broker_failed,
                previous=seen.broker_last,
                db_now=seen.db_now,
                after_s=self.after_s,
            )
            return outage, floor
        self._broker_failed = None
        if seen.broker_open:
            with transaction(engine) as conn:
                lease.check(conn)
                back = broker_outage.resolve_outage(conn, seen.broker_open[0].detail, actor=actor)
            floor = back or seen.db_now
        return None, floor


@dataclass(frozen=True)
class _Seen:
    """What one check read in one transaction."""

    db_now: datetime
    work: Mapping[str, Any]
    opened: Mapping[str, Any]
    agents: list[str]
    presence: Mapping[str, Any]
    last: dict[str, LastAlert]
    broker_last: LastAlert | None
    broker_open: list[Any]

    def views(self, counts: dict[str, int] | None) -> list[AgentView]:
        work, presence = self.work, self.presence
        return [
            AgentView(
                agent=agent,
                pending=work[agent].pending if agent in work else 0,
                processing=work[agent].processing if agent in work else 0,
                oldest_waiting=work[agent].oldest if agent in work else None,
                live=presence[agent].live,
                last_heard=presence[agent].last_heard,
                consumers=None if counts is None else counts.get(agent),
            )
            for agent in self.agents
        ]


def _read(engine: Engine) -> _Seen:
    with transaction(engine) as conn:
        work = waiting_work(conn)
        opened = {r.dedup_key.split(":", 1)[1]: r for r in open_alerts(conn, AGENT_OUTAGE)}
        agents = sorted(set(work) | set(opened))
        last: dict[str, LastAlert] = {
            a: LastAlert(open=True, created_at=r.created_at, back_at=None)
            for a, r in opened.items()
        }
        for agent in set(work) - set(opened):
            found = _last(conn, agent)
            if found is not None:
                last[agent] = found
        return _Seen(
            db_now=database_now(conn),
            work=work,
            opened=opened,
            agents=agents,
            presence=fleet.presence(conn, agents),
            last=last,
            broker_last=_last(conn, broker_outage.SUBJECT, kind=BROKER_OUTAGE),
            broker_open=open_alerts(conn, BROKER_OUTAGE),
        )


def _last(conn: Connection, subject: str, *, kind: str = AGENT_OUTAGE) -> LastAlert | None:
    row = latest_alert(conn, kind, subject)
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
