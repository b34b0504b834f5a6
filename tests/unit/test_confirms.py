"""ConfirmTracker: how broker acks, nacks and returns map to the messages of a batch."""

from __future__ import annotations

from sasflow.transport.confirms import ConfirmTracker


def _send(tracker: ConfirmTracker, *routing_keys: str) -> list[int]:
    return [tracker.sent("", rk, rk.encode(), mandatory=True) for rk in routing_keys]


def test_tags_count_from_one_per_channel() -> None:
    assert _send(ConfirmTracker(), "a", "b", "c") == [1, 2, 3]


def test_a_multiple_ack_settles_every_earlier_tag() -> None:
    tracker = ConfirmTracker()
    tags = _send(tracker, "a", "b", "c")
    tracker.confirmed(2, multiple=True, nack=False)
    assert tracker.is_settled(tags[:2])
    assert not tracker.is_settled(tags)
    tracker.confirmed(3, multiple=False, nack=False)
    assert [tracker.take(t) for t in tags] == [None, None, None]


def test_out_of_order_acks_settle_only_their_tag() -> None:
    tracker = ConfirmTracker()
    _send(tracker, "a", "b")
    tracker.confirmed(2, multiple=False, nack=False)
    assert not tracker.is_settled([1])
    assert tracker.is_settled([2])


def test_a_nack_refuses_its_messages() -> None:
    tracker = ConfirmTracker()
    tags = _send(tracker, "a", "b", "c")
    tracker.confirmed(1, multiple=False, nack=False)
    tracker.confirmed(3, multiple=True, nack=True)
    assert [tracker.take(t) is None for t in tags] == [True, False, False]


def test_a_return_refuses_the_oldest_matching_message_at_its_ack() -> None:
    tracker = ConfirmTracker()
    first = tracker.sent("", "q", b"same", mandatory=True)
    second = tracker.sent("", "gone", b"same", mandatory=True)
    third = tracker.sent("", "gone", b"same", mandatory=True)
    tracker.returned("", "gone", b"same", "312 NO_ROUTE")
    tracker.confirmed(third, multiple=True, nack=False)
    assert tracker.take(first) is None
    assert tracker.take(second) == "unroutable: 312 NO_ROUTE"
    assert tracker.take(third) is None


def test_a_non_mandatory_message_is_never_matched_to_a_return() -> None:
    tracker = ConfirmTracker()
    loose = tracker.sent("", "gone", b"x", mandatory=False)
    strict = tracker.sent("", "gone", b"x", mandatory=True)
    tracker.returned("", "gone", b"x", "312 NO_ROUTE")
    tracker.confirmed(strict, multiple=True, nack=False)
    assert tracker.take(loose) is None
    assert tracker.take(strict) == "unroutable: 312 NO_ROUTE"


def test_forgotten_tags_are_neither_pending_nor_settled() -> None:
    tracker = ConfirmTracker()
    tags = _send(tracker, "a", "b")
    tracker.confirmed(1, multiple=False, nack=False)
    tracker.forget(tags)
    tracker.confirmed(2, multiple=False, nack=False)  # a late ack of a forgotten tag
    assert not tracker.is_settled([1])
    assert not tracker.is_settled([2])
