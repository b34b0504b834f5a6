"""Publisher-confirm bookkeeping for a batch of messages in flight on one confirm channel.

The broker numbers the messages of a confirm-mode channel 1, 2, 3... and settles them with
`basic.ack` or `basic.nack`, one at a time or `multiple` up to a tag, in any order. A mandatory
message it cannot route comes back as `basic.return` *before* the ack that settles it; a
return carries no delivery tag, so it is matched to the oldest unsettled mandatory message
with the same exchange, routing key and body (returns arrive in publish order, and only two
identical messages could be confused, which then makes no difference).

A `basic.nack` says the broker could not take the message now (a quorum queue electing a
leader, a queue full under `reject-publish`), not that the message is bad: a message AMQP
cannot carry, or one over the broker's size limit, is refused otherwise. So a nacked message
is one not sent, to publish again on a new connection (BrokerUnavailableError), never refused
for good: RabbitMQ 3.10 keeps nacking every publish of a channel that first published to a
quorum queue just after its leader's node died, until that channel is closed.
"""

from __future__ import annotations

from dataclasses import dataclass

from sasflow.errors import BrokerUnavailableError, PublishError, UnroutableError

Refusal = PublishError | BrokerUnavailableError
"""Why a settled message was not taken: refused for good, or to be sent again."""


@dataclass
class _Slot:
    exchange: str
    routing_key: str
    body: bytes
    mandatory: bool
    returned: str | None = None


class ConfirmTracker:
    """Tags of the messages sent on one channel, and how the broker settled each of them."""

    def __init__(self) -> None:
        self._last_tag = 0
        self._pending: dict[int, _Slot] = {}
        self._settled: dict[int, Refusal | None] = {}

    def sent(self, exchange: str, routing_key: str, body: bytes, *, mandatory: bool) -> int:
        """Record one message handed to the channel; returns its delivery tag."""
        self._last_tag += 1
        self._pending[self._last_tag] = _Slot(exchange, routing_key, body, mandatory)
        return self._last_tag

    def returned(self, exchange: str, routing_key: str, body: bytes, reason: str) -> None:
        """A `basic.return`: the matching message will be refused when its ack arrives."""
        for slot in self._pending.values():  # dicts keep insertion (= tag) order
            if (
                slot.mandatory
                and slot.returned is None
                and slot.exchange == exchange
                and slot.routing_key == routing_key
                and slot.body == body
            ):
                slot.returned = reason
                return

    def confirmed(self, tag: int, *, multiple: bool, nack: bool) -> None:
        """A `basic.ack` or `basic.nack` for `tag` (and every earlier tag if `multiple`)."""
        tags = [t for t in self._pending if t <= tag] if multiple else [tag]
        for t in tags:
            slot = self._pending.pop(t, None)
            if slot is None:
                continue
            if nack:
                self._settled[t] = BrokerUnavailableError(
                    "broker could not take the message (nacked): publish it again on a new "
                    "connection"
                )
            elif slot.returned is not None:
                self._settled[t] = UnroutableError(
                    f"broker refused the message: unroutable: {slot.returned}"
                )
            else:
                self._settled[t] = None

    @property
    def tracked(self) -> int:
        """Tags awaiting their confirm, or settled and not taken yet."""
        return len(self._pending) + len(self._settled)

    def is_settled(self, tags: list[int]) -> bool:
        return all(t in self._settled for t in tags)

    def take(self, tag: int) -> Refusal | None:
        """Forget a settled tag; returns why it was refused (UnroutableError when it was
        returned, BrokerUnavailableError when nacked), or None when it was confirmed."""
        return self._settled.pop(tag)

    def forget(self, tags: list[int]) -> None:
        """Drop what is known of `tags` (the channel they were sent on is gone)."""
        for t in tags:
            self._pending.pop(t, None)
            self._settled.pop(t, None)
