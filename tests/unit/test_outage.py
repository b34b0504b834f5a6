"""The outage watch's decisions without I/O (supervisor.outage): who is out, since when, what
to raise and what to resolve."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sasflow.supervisor.broker_outage import decide_raise, outage_since
from sasflow.supervisor.outage import AgentView, LastAlert, decide, outage_start

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
    still_open = {"alerted": LastAlert(open=True, created_at=NOW, back_at=None)}
    decision = decide(views, last=still_open, noticed={}, db_now=NOW, after_s=30)
    assert [(o.view.agent, o.since) for o in decision.raise_] == [
        ("down", NOW - timedelta(seconds=31)),
        ("flying", NOW - timedelta(seconds=300)),
    ]
    assert decision.resolve == []


def test_a_consumer_not_seen_is_timed_from_when_it_was_first_noticed() -> None:
    view = _view(live=1)
    first = decide([view], last={}, noticed={}, db_now=NOW, after_s=30)
    assert first.raise_ == [], "noticed just now"
    later = decide(
        [view],
        last={},
        noticed={"pay": NOW - timedelta(seconds=30)},
        db_now=NOW,
        after_s=30,
    )
    assert [o.view.agent for o in later.raise_] == ["pay"]


def test_an_open_outage_is_resolved_when_the_agent_is_back_even_with_work_left() -> None:
    back = _view("pay", consumers=1, pending=40)
    still = _view("ship", pending=0)
    opened = LastAlert(open=True, created_at=NOW - timedelta(seconds=60), back_at=None)
    decision = decide(
        [back, still], last={"pay": opened, "ship": opened}, noticed={}, db_now=NOW, after_s=30
    )
    assert [v.agent for v in decision.resolve] == ["pay"]
    assert decision.raise_ == []


def test_an_outage_acknowledged_by_an_operator_is_not_raised_again_while_it_lasts() -> None:
    heard = NOW - timedelta(seconds=300)
    acknowledged = LastAlert(open=False, created_at=heard + timedelta(seconds=40), back_at=None)
    view = _view(last_heard=heard)
    decision = decide([view], last={"pay": acknowledged}, noticed={}, db_now=NOW, after_s=30)
    assert decision.raise_ == []
    older = LastAlert(open=False, created_at=heard - timedelta(seconds=1), back_at=None)
    again = decide([view], last={"pay": older}, noticed={}, db_now=NOW, after_s=30)
    assert [o.view.agent for o in again.raise_] == ["pay"], "an earlier outage's alert"


def test_a_new_outage_is_timed_from_when_the_agent_was_last_back() -> None:
    """An agent that sends no heartbeat (last heard long ago) came back, then went away
    again: the new outage starts no earlier than its return."""
    back_at = NOW - timedelta(seconds=20)
    resolved = LastAlert(open=False, created_at=NOW - timedelta(seconds=600), back_at=back_at)
    view = _view(last_heard=None, oldest=NOW - timedelta(seconds=900))
    early = decide([view], last={"pay": resolved}, noticed={}, db_now=NOW, after_s=30)
    assert early.raise_ == []
    later = NOW + timedelta(seconds=15)
    due = decide([view], last={"pay": resolved}, noticed={}, db_now=later, after_s=30)
    assert [(o.view.agent, o.since) for o in due.raise_] == [("pay", back_at)]


def test_a_broker_outage_is_raised_once_for_the_agents_nobody_has_heard_of() -> None:
    views = [
        _view("pay", last_heard=NOW - timedelta(seconds=40)),
        _view("ship", last_heard=NOW - timedelta(seconds=50)),
        _view("idle", pending=0, last_heard=NOW - timedelta(seconds=90)),
        _view("alive", live=1, consumers=None),
    ]
    failed = NOW - timedelta(seconds=10)
    outage = decide_raise(
        views, error="refused", first_failed=failed, previous=None, db_now=NOW, after_s=30
    )
    assert outage is not None
    assert outage.agents == {"pay": 3, "ship": 3}, "neither the idle agent nor the live one"
    assert outage.since == NOW - timedelta(seconds=40), "the last word from a stranded agent"
    early = decide_raise(
        views, error="x", first_failed=failed, previous=None, db_now=failed, after_s=31
    )
    assert early is None, "not before after_s"
    live_only = [_view("alive", live=1, consumers=None)]
    assert (
        decide_raise(
            live_only, error="x", first_failed=failed, previous=None, db_now=NOW, after_s=0
        )
        is None
    ), "nothing waits for an agent nobody heard of"


def test_a_broker_outage_is_not_raised_twice_nor_timed_before_the_broker_was_back() -> None:
    views = [_view("pay", last_heard=NOW - timedelta(seconds=300))]
    failed = NOW - timedelta(seconds=5)

    def decided(previous: LastAlert) -> object:
        return decide_raise(
            views, error="x", first_failed=failed, previous=previous, db_now=NOW, after_s=30
        )

    assert decided(LastAlert(open=True, created_at=NOW, back_at=None)) is None, "open"
    acknowledged = LastAlert(open=False, created_at=NOW - timedelta(seconds=60), back_at=None)
    assert decided(acknowledged) is None, "acknowledged by an operator while it lasts"
    back = LastAlert(
        open=False,
        created_at=NOW - timedelta(seconds=900),
        back_at=NOW - timedelta(seconds=20),
    )
    assert decided(back) is None, "20 s since the broker was back: not yet 30"
    assert outage_since(views, failed, back) == back.back_at, "agents silent since before"
    heard_since = [_view("pay", last_heard=NOW - timedelta(seconds=2))]
    assert outage_since(heard_since, failed, back) == failed, "the earlier of the two"


def test_no_agent_outage_is_timed_from_before_the_floor() -> None:
    views = [_view("pay", last_heard=NOW - timedelta(seconds=300))]
    floor = NOW - timedelta(seconds=10)
    held = decide(views, last={}, noticed={}, db_now=NOW, after_s=30, floor=floor)
    assert held.raise_ == []
    later = decide(views, last={}, noticed={}, db_now=NOW, after_s=10, floor=floor)
    assert [(o.view.agent, o.since) for o in later.raise_] == [("pay", floor)]
