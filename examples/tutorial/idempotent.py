"""Idempotent handlers (docs/howto/idempotent-agents.md): one for a remote service that
deduplicates on an idempotency key, one for a service that cannot."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Protocol

from sasflow import BreakerPolicy
from sasflow.agents import Agent, Call, PermanentError, TransientError

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


def make_payments_agent(bank_url: str) -> Agent:
    """Charges through a bank API that honours the `Idempotency-Key` header."""
    payments = Agent("payments", breakers={"bank": BreakerPolicy(fail_max=5, reset_timeout=30)})

    @payments.handler("charge", dependency="bank")
    def charge(call: Call) -> dict[str, Any]:
        body = {"amount": call.input["amount"], "currency": "EUR"}
        request = urllib.request.Request(  # noqa: S310 - the URL is the operator's setting
            bank_url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                # The same key on every attempt of this step: the bank charges once.
                "Idempotency-Key": call.idempotency_key,
            },
        )
        try:
            # Never wait past the step's deadline: nobody would read the answer.
            with urllib.request.urlopen(request, timeout=call.remaining()) as response:  # noqa: S310
                answer: dict[str, Any] = json.load(response)
                return answer
        except urllib.error.HTTPError as exc:
            if exc.code in RETRYABLE_STATUS:
                raise TransientError(f"bank answered {exc.code}") from exc
            raise PermanentError(f"bank refused the charge: {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, TimeoutError) as exc:
            raise TransientError(f"bank unreachable: {exc}") from exc

    return payments


class Carrier(Protocol):
    """A shipping API without idempotency keys, but with a reference field we choose."""

    def find_shipment(self, reference: str) -> dict[str, Any] | None: ...

    def create_shipment(self, reference: str, address: str) -> dict[str, Any]: ...


def make_shipping_agent(carrier: Carrier) -> Agent:
    """Ships through a carrier that cannot deduplicate: look first, then create."""
    shipping = Agent("shipping")

    @shipping.handler("ship")
    def ship(call: Call) -> dict[str, Any]:
        # An earlier attempt may have created the shipment and lost only its reply: the key,
        # stored as the shipment's reference, finds it again.
        existing = carrier.find_shipment(call.idempotency_key)
        if existing is not None:
            return existing
        return carrier.create_shipment(call.idempotency_key, call.input["address"])

    return shipping
