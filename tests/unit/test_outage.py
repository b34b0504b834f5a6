"""The outage watch's decisions without I/O (supervisor.outage): who is out, since when, what
to raise and what to resolve."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sasflow.supervisor.outage import AgentView, decide, outage_start

NOW = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)


def _view(
    agent: str = "pay",
    *,
    pending: int = 3,
    processing: int = 0,
    live: int = 0,
    last_heard: datetime | None = NOW - timedelta(seconds=60),
    consumers: int | None = 0,
    oldest: datetime | None = NOW - timedelta(seconds=10),
) -> AgentView:
    return AgentView(agent, pending, processing, oldest, live, last_heard, consumers)


def test_the_broker_says_who_serves_and_the_fleet_view_when_it_cannot() -> None:
    assert _view(consumers=0, live=2).out, "instances heartbeat, nothing consumes"
    assert not _view(consumers=1, live=0).out, "an agent without heartbeats that consumes"
    assert _view(consumers=None, live=0).out
    assert not _view(consumers=None, live=1).out


def test_an_outage_starts_when_the_agent_was_last_heard_of() -> None:
    heard = NOW - timedelta(seconds=45)
    assert outage_start(_view(last_heard=heard), NOW) == heard
    never = _view(last_heard=None)
    assert outage_start(never, NOW) == never.oldest_waiting, "never seen: its oldest step"
    noticed = NOW - timedelta(seconds=5)
    assert outage_start(_view(live=1), noticed) == noticed, "live but not consuming"
    assert outage_start(_view(consumers=1), noticed) is None


def test_raised_once_past_the_delay_and_only_while_work_waits() -> None:
    views = [
        _view("down", last_heard=NOW - timedelta(seconds=31)),
        _view("recent", last_heard=NOW - timedelta(seconds=29)),
        _view("idle", pending=0, last_heard=NOW - timedelta(seconds=300)),
        _view("flying", pending=0, processing=2, last_heard=NOW - timedelta(seconds=300)),
        _view("fine", consumers=1),
        _view("alerted", last_heard=NOW - timedelta(seconds=300)),
    ]
    decision = decide(views, open_outages=["alerted"], noticed={}, db_now=NOW, after_s=30)
    assert [(o.view.agent, o.since) for o in decision.raise_] == [
        ("down", NOW - timedelta(seconds=31)),
        ("flying", NOW - timedelta(seconds=300)),
    ]
    assert decision.resolve == []


def test_a_consumer_not_seen_is_timed_from_when_it_was_first_noticed() -> None:
    view = _view(live=1)
    first = decide([view], open_outages=[], noticed={}, db_now=NOW, after_s=30)
    assert first.raise_ == [], "noticed just now"
    later = decide(
        [view],
        open_outages=[],
        noticed={"pay": NOW - timedelta(seconds=30)},
        db_now=NOW,
        after_s=30,
    )
    assert [o.view.agent for o in later.raise_] == ["pay"]


def test_an_open_outage_is_resolved_when_the_agent_is_back_even_with_work_left() -> None:
    back = _view("pay", consumers=1, pending=40)
    still = _view("ship", pending=0)
    decision = decide(
        [back, still], open_outages=["pay", "ship"], noticed={}, db_now=NOW, after_s=30
    )
    assert [v.agent for v in decision.resolve] == ["pay"]
    assert decision.raise_ == []
