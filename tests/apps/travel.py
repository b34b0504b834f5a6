"""A trip booking app: a flight, a hotel, then a car that fails, each with its cancellation;
the compensation tests and the engine contract run it."""

from __future__ import annotations

from typing import Any

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call, PermanentError


def travel(*broken_undo: str) -> tuple[Registry, list[tuple[str, Any]], set[str]]:
    """Book a flight, a hotel, then a car (which fails); each booking has its cancellation."""
    calls: list[tuple[str, Any]] = []
    broken = set(broken_undo)
    booking = Agent("booking")

    @booking.handler("book")
    def book(call: Call) -> dict[str, str]:
        calls.append(("book", call.step))
        if call.step == "car":
            raise PermanentError("no cars left")
        return {"reference": f"{call.step}-{call.idempotency_key[:6]}"}

    @booking.handler("cancel")
    def cancel(call: Call) -> dict[str, str]:
        calls.append(("cancel", call.input))
        if call.step in broken:
            raise PermanentError(f"{call.step} cannot be cancelled")
        return {"cancelled": call.input["output"]["reference"]}

    quick = StepPolicy(timeout=5, max_failures=1)
    flow = Workflow(
        "trip",
        [
            Step("flight", "booking", "book", compensate="cancel", policy=quick),
            Step("hotel", "booking", "book", compensate="cancel", policy=quick),
            Step("car", "booking", "book", compensate="cancel", policy=quick),
        ],
        on_failure="compensate",
    )
    return Registry([flow], [booking]), calls, broken
