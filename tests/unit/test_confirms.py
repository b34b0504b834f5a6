"""ConfirmTracker: how broker acks, nacks and returns map to the messages of a batch;
RabbitMQTransport.publish_many's one-message-at-a-time fallback after an unknown refusal; and
which channel closes refuse the message awaiting its confirm."""

from __future__ import annotations

from collections.abc import Sequence

import pika.exceptions
import pytest

from sasflow.errors import BrokerUnavailableError, PublishError, UnroutableError
from sasflow.transport import rabbitmq
from sasflow.transport.base import Outgoing
from sasflow.transport.confirms import ConfirmTracker
from sasflow.transport.rabbitmq import RabbitMQTransport


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


def test_a_nack_asks_for_its_messages_to_be_sent_again() -> None:
    """The broker could not take them now: not refused for good (PublishError), but to be
    published again on a new connection."""
    tracker = ConfirmTracker()
    tags = _send(tracker, "a", "b", "c")
    tracker.confirmed(1, multiple=False, nack=False)
    tracker.confirmed(3, multiple=True, nack=True)
    taken = [tracker.take(t) for t in tags]
    assert taken[0] is None
    assert [type(t) for t in taken[1:]] == [BrokerUnavailableError] * 2


def test_a_return_refuses_the_oldest_matching_message_at_its_ack() -> None:
    tracker = ConfirmTracker()
    first = tracker.sent("", "q", b"same", mandatory=True)
    second = tracker.sent("", "gone", b"same", mandatory=True)
    third = tracker.sent("", "gone", b"same", mandatory=True)
    tracker.returned("", "gone", b"same", "312 NO_ROUTE")
    tracker.confirmed(third, multiple=True, nack=False)
    assert tracker.take(first) is None
    refused = tracker.take(second)
    assert isinstance(refused, UnroutableError)
    assert str(refused) == "broker refused the message: unroutable: 312 NO_ROUTE"
    assert tracker.take(third) is None


def test_a_non_mandatory_message_is_never_matched_to_a_return() -> None:
    tracker = ConfirmTracker()
    loose = tracker.sent("", "gone", b"x", mandatory=False)
    strict = tracker.sent("", "gone", b"x", mandatory=True)
    tracker.returned("", "gone", b"x", "312 NO_ROUTE")
    tracker.confirmed(strict, multiple=True, nack=False)
    assert tracker.take(loose) is None
    assert isinstance(tracker.take(strict), UnroutableError)


def test_forgotten_tags_are_neither_pending_nor_settled() -> None:
    tracker = ConfirmTracker()
    tags = _send(tracker, "a", "b")
    tracker.confirmed(1, multiple=False, nack=False)
    tracker.forget(tags)
    tracker.confirmed(2, multiple=False, nack=False)  # a late ack of a forgotten tag
    assert not tracker.is_settled([1])
    assert not tracker.is_settled([2])


class _Scripted(RabbitMQTransport):
    """Refuses the message with body b"big" and then, as the broker does, has no channel."""

    def __init__(self) -> None:
        super().__init__("amqp://localhost:5672/%2F", process_name="test")
        self.sent: list[bytes] = []
        self.open = True

    def _publish_batch(self, messages: Sequence[Outgoing]) -> list[Exception | None]:
        if not self.open:
            raise BrokerUnavailableError("closed")
        if len(messages) > 1 and any(m.body == b"big" for m in messages):
            self._serial, self.open = True, False  # which one is unknown in a batch
            raise BrokerUnavailableError("closed")
        (message,) = messages
        self.sent.append(message.body)
        if message.body == b"big":
            self.open = False
            return [PublishError("too large")]
        return [None]

    def _chan_open(self) -> bool:
        return self.open


def test_after_an_unknown_refusal_the_next_batch_goes_one_by_one_and_stops_at_the_culprit() -> None:
    """The refused message gets its own PublishError; those after it are reported unsent
    (the channel is gone), those before it confirmed; the batch after that is serial again
    until one completes."""
    transport = _Scripted()
    batch = [Outgoing("", "q", body) for body in (b"a", b"big", b"c")]
    with pytest.raises(BrokerUnavailableError):
        transport.publish_many(batch)

    transport.open = True  # reconnected
    results = transport.publish_many(batch)

    assert results[0] is None
    assert isinstance(results[1], PublishError)
    assert isinstance(results[2], BrokerUnavailableError)
    assert transport.sent == [b"a", b"big"]
    transport.open = True
    assert transport.publish_many([Outgoing("", "q", b"c"), Outgoing("", "q", b"d")]) == [
        None,
        None,
    ]
    assert transport.sent[-2:] == [b"c", b"d"]
    assert not transport._serial


@pytest.mark.parametrize(
    ("code", "text", "refused"),
    [
        (
            406,
            "PRECONDITION_FAILED - message size 300 is larger than configured max size 200",
            True,
        ),
        (
            406,
            (
                "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout "
                "value used: 10000 ms. This timeout value can be configured, see consumers doc "
                "guide to learn more"
            ),
            False,
        ),
        (406, "PRECONDITION_FAILED - unknown delivery tag 7", False),
        (404, "NOT_FOUND - no exchange 'x' in vhost '/'", False),
    ],
)
def test_only_a_close_over_a_published_message_refuses_the_message_awaiting_its_confirm(
    code: int, text: str, refused: bool
) -> None:
    """A channel closed over its consumer side (the broker's consumer timeout) has the
    messages awaiting their confirms sent again, not refused for good."""
    closed = pika.exceptions.ChannelClosedByBroker(code, text)
    assert rabbitmq._refuses_message(closed) is refused
