"""An app for the map step tests (docs/concepts.md "Map steps"): agent `stock`; workflows
`orders` (fail fast), `orders_continue` and `orders_compensate`: load the lines of the run's
input, reserve each line (a map over `steps.load.lines`, parallelism 5, at most 30 lines; a
line `{"fail": true}` fails for good), then ship what the map returned. The agent records what
each call saw (`seen`), how many reservations ran at once (`most_at_once`) and the lines
released when a run compensates (`released`)."""

from __future__ import annotations

import threading
import time
from typing import Any

from sasflow import Registry, Step, StepContext, StepPolicy, Workflow
from sasflow.agents import Agent, Call, PermanentError

stock = Agent("stock")

_lock = threading.Lock()
seen: list[tuple[int, int | None, int | None, Any]] = []
"""(run id, map index, map size, input) of every reservation call."""
released: list[tuple[int, int | None]] = []
"""(run id, map index) of every release, in the order they ran."""
_at_once = [0, 0]
"""Reservations running now, and the most at once."""


def most_at_once() -> int:
    with _lock:
        return _at_once[1]


def reset() -> None:
    with _lock:
        seen.clear()
        released.clear()
        _at_once[:] = [0, 0]


@stock.handler("load")
def load(call: Call) -> dict[str, Any]:
    return {"lines": call.input["lines"]}


@stock.handler("reserve")
def reserve(call: Call) -> dict[str, Any]:
    with _lock:
        seen.append((call.run_id, call.map_index, call.map_size, call.input))
        _at_once[0] += 1
        _at_once[1] = max(_at_once)
    try:
        time.sleep(0.02)  # long enough for the items released together to overlap
        if isinstance(call.input, dict) and call.input.get("fail"):
            raise PermanentError(f"line {call.map_index} is out of stock")
        return {"sku": call.input["sku"], "index": call.map_index}
    finally:
        with _lock:
            _at_once[0] -= 1


@stock.handler("release")
def release(call: Call) -> dict[str, Any]:
    with _lock:
        released.append((call.run_id, call.input["output"]["index"]))
    return {}


@stock.handler("ship")
def ship(call: Call) -> Any:
    return call.input


def _reserved(ctx: StepContext) -> dict[str, Any]:
    return {"reserved": ctx.outputs["reserve"]}


FAST = StepPolicy(timeout=10, max_failures=1)


def _orders(name: str, on_item_failure: str) -> Workflow:
    return Workflow(
        name,
        [
            Step("load", "stock", "load", policy=FAST),
            Step.map(
                "reserve",
                agent="stock",
                action="reserve",
                items="steps.load.lines",
                max_items=30,
                parallelism=5,
                on_item_failure=on_item_failure,
                compensate="release",
                policy=FAST,
            ),
            Step("ship", "stock", "ship", input=_reserved, policy=FAST),
        ],
    )


orders = _orders("orders", "fail_fast")
orders_continue = _orders("orders_continue", "continue")
orders_compensate = _orders("orders_compensate", "compensate")

registry = Registry([orders, orders_continue, orders_compensate], [stock])
