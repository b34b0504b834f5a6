"""The example's workflows: the demo's orders with lines, and shipping as a child workflow.

    order:    check -> reserve[0..n) (map) -> charge -> payment_confirmed -> cool_off
              -> ship (child: shipping)
    shipping: pack -> gift_wrap (only when input.gift) -> label -> dispatch

A retail `order` that fails is compensated: the charge refunded, then every reserved line
released in reverse line order (a shipping child that completed is compensated first, as part
of the same saga); a `b2b-order` goes to `error`; an `express-order` waits seconds for its
payment. A shipping run that fails compensates itself (the label voided, the parcel unpacked),
and its parent's `ship` step fails with it.
"""

from __future__ import annotations

from typing import Any

from sasflow import Default, Step, StepContext, Workflow
from sasflow.demo.app import COOL_OFF_S, EXPRESS_WAIT_S, PAYMENT_WAIT_S, STEP_POLICY
from sasflow.demo.provider import EVENT
from sasflow.when import Cond

VERSION = 2
"""Of the order workflows: version 1 reserved the order's one sku (the demo's definition)."""
RESERVE_PARALLELISM = 2
"""Lines of one order reserved at once (the others wait, released in line order)."""


def _check_input(ctx: StepContext) -> dict[str, Any]:
    return {"lines": ctx.run_input["lines"]}


def _charge_input(ctx: StepContext) -> dict[str, Any]:
    order = ctx.run_input
    return {
        "amount": ctx.outputs["check"]["units"] * order["unit_price"],
        "card": order["card"],
        "reservations": [r["reservation"] for r in ctx.outputs["reserve"]],
        "trouble": order["trouble"],
        "order_id": order.get("order_id"),
    }


def _order_steps(on_payment_timeout: str | Default, wait_s: float) -> list[Step]:
    return [
        Step("check", "inventory", "check", input=_check_input, policy=STEP_POLICY),
        Step.map(
            "reserve",
            agent="inventory",
            action="reserve",
            items="input.lines",
            max_items=100,
            parallelism=RESERVE_PARALLELISM,
            policy=STEP_POLICY,
            compensate="release",
        ),
        Step(
            "charge",
            "payments",
            "charge",
            input=_charge_input,
            policy=STEP_POLICY,
            compensate="refund",
        ),
        Step.wait_for(
            EVENT,
            event=EVENT,
            match="input.order_id",
            timeout=wait_s,
            on_timeout=on_payment_timeout,
        ),
        Step.sleep("cool_off", seconds=COOL_OFF_S),
        # The child's input is the order's (None: this run's input).
        Step.child("ship", workflow="shipping"),
    ]


def _pack_input(ctx: StepContext) -> dict[str, Any]:
    return {"order_id": ctx.run_input["order_id"], "lines": ctx.run_input["lines"]}


def _gift_wrap_input(ctx: StepContext) -> dict[str, Any]:
    return {"parcel": ctx.outputs["pack"]["parcel"]}


def _label_input(ctx: StepContext) -> dict[str, Any]:
    return {"address": ctx.run_input["address"], "parcel": ctx.outputs["pack"]["parcel"]}


def _dispatch_input(ctx: StepContext) -> dict[str, Any]:
    return {"tracking": ctx.outputs["label"]["tracking"], "trouble": ctx.run_input["trouble"]}


def shipping() -> Workflow:
    return Workflow(
        "shipping",
        [
            Step("pack", "shipping", "pack", input=_pack_input, compensate="unpack"),
            Step(
                "gift_wrap",
                "shipping",
                "gift_wrap",
                input=_gift_wrap_input,
                when=Cond("input.gift", "truthy"),
            ),
            # Runs whether the gift was wrapped or skipped; reads only pack's output.
            Step(
                "label",
                "shipping",
                "label",
                input=_label_input,
                if_skipped="run",
                compensate="void_label",
            ),
            Step("dispatch", "shipping", "dispatch", input=_dispatch_input, policy=STEP_POLICY),
        ],
        on_failure="compensate",
    )


def workflows() -> list[Workflow]:
    return [
        # An unconfirmed retail payment is refunded; a business customer's goes to a person.
        Workflow(
            "order",
            _order_steps("compensate", PAYMENT_WAIT_S),
            version=VERSION,
            on_failure="compensate",
        ),
        Workflow(
            "b2b-order",
            _order_steps("fail", PAYMENT_WAIT_S),
            version=VERSION,
            on_failure="error",
        ),
        Workflow(
            "express-order",
            _order_steps("compensate", EXPRESS_WAIT_S),
            version=VERSION,
            on_failure="compensate",
        ),
        shipping(),
    ]
