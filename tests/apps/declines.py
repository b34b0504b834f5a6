"""An app whose every run fails the same way, for the incident tests: the card is declined, with
the order number and a fresh reference in the message (what a cause leaves out)."""

from __future__ import annotations

import uuid
from typing import Any

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call, PermanentError

cards = Agent("cards")


@cards.handler("charge")
def charge(call: Call) -> dict[str, Any]:
    raise PermanentError(f"card declined for order {call.input['order']} (ref {uuid.uuid4()})")


payment = Workflow(
    "card_payment",
    [Step("charge", "cards", "charge", policy=StepPolicy(timeout=10, max_failures=1))],
)

registry = Registry([payment], [cards])
