"""An app for the child workflow tests (docs/concepts.md "Child workflows"): agent `shop`;
the child workflow `shipping` (label then send, each undone by its own action; an input with
`{"fail": true}` fails at send), parents `order` (pack, the child `ship` over pack's output,
then charge; compensates on failure, a run input `{"fail_charge": true}` fails charge) and
`order_error` (pack then ship, ends in error); `fanout`: three children of `hold`, whose one
step runs until it is cancelled or `release` is set. The agent records its calls in order
(`calls`: (run id, action)) and the holds running (`holding`)."""

from __future__ import annotations

import threading
from typing import Any

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call, PermanentError

shop = Agent("shop")

_lock = threading.Lock()
calls: list[tuple[int, str]] = []
holding: set[int] = set()
"""The step ids of holds running now."""
release = threading.Event()


def reset() -> None:
    with _lock:
        calls.clear()
        holding.clear()
    release.clear()


def _seen(call: Call, action: str) -> None:
    with _lock:
        calls.append((call.run_id, action))


@shop.handler("pack")
def pack(call: Call) -> dict[str, Any]:
    _seen(call, "pack")
    return {"parcel": f"parcel-{call.input['order']}", "fail": call.input.get("fail_ship", False)}


@shop.handler("label")
def label(call: Call) -> dict[str, Any]:
    _seen(call, "label")
    return {"label": f"label-{call.input['parcel']}"}


@shop.handler("send")
def send(call: Call) -> dict[str, Any]:
    _seen(call, "send")
    if call.input.get("fail"):
        raise PermanentError("the carrier refused the parcel")
    return {"tracking": f"track-{call.input['parcel']}"}


@shop.handler("charge")
def charge(call: Call) -> dict[str, Any]:
    _seen(call, "charge")
    if call.input.get("fail_charge"):
        raise PermanentError("card declined")
    return {"charged": True}


for _undo in ("unpack", "unlabel", "unsend"):

    def _undoer(call: Call, action: str = _undo) -> dict[str, Any]:
        _seen(call, action)
        return {}

    shop.handler(_undo)(_undoer)


@shop.handler("hold")
def hold(call: Call) -> str:
    _seen(call, "hold")
    with _lock:
        holding.add(call.step_id)
    try:
        while not call.cancelled.wait(0.05) and not release.is_set():
            pass
    finally:
        with _lock:
            holding.discard(call.step_id)
    return "cancelled" if call.cancelled.is_set() else "released"


FAST = StepPolicy(timeout=30, max_failures=1)


def _workflows() -> list[Workflow]:
    ship = Step.child("ship", workflow="shipping", input="steps.pack")
    return [
        Workflow(
            "shipping",
            [
                Step("label", "shop", "label", policy=FAST, compensate="unlabel"),
                Step("send", "shop", "send", policy=FAST, compensate="unsend"),
            ],
        ),
        Workflow(
            "order",
            [
                Step("pack", "shop", "pack", policy=FAST, compensate="unpack"),
                ship,
                Step("charge", "shop", "charge", policy=FAST),
            ],
            on_failure="compensate",
        ),
        Workflow("order_error", [Step("pack", "shop", "pack", policy=FAST), ship]),
        Workflow("hold", [Step("hold", "shop", "hold", policy=StepPolicy(timeout=120))]),
        Workflow(
            "fanout",
            [
                Step("start", "shop", "pack", policy=FAST),
                *(Step.child(f"c{i}", workflow="hold", after=("start",)) for i in range(1, 4)),
            ],
        ),
    ]


registry = Registry(_workflows(), [shop])
