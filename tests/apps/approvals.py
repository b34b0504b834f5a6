"""An app for the approval tests: `refund` prepares, waits for an approval of the `refunds`
group with a form, then pays; `refund_undo` is the same but compensates on failure; `quick`
waits for an approval of the default group that is overdue after a moment."""

from __future__ import annotations

from typing import Any

from sasflow import FieldSpec, Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call

desk = Agent("desk")


@desk.handler("prepare")
def prepare(call: Call) -> dict[str, Any]:
    return {"prepared": call.input.get("order")}


@desk.handler("pay")
def pay(call: Call) -> dict[str, Any]:
    return {"paid": call.input.get("order")}


@desk.handler("undo")
def undo(call: Call) -> dict[str, Any]:
    return {"undone": call.run_id}


POLICY = StepPolicy(timeout=60)
FORM: dict[str, FieldSpec | type | list[str]] = {
    "amount": int,
    "channel": ["card", "bank"],
    "note": FieldSpec(str, required=False),
}


def _refund(name: str, on_failure: Any) -> Workflow:
    return Workflow(
        name,
        [
            Step("prepare", "desk", "prepare", policy=POLICY, compensate="undo"),
            Step.approval("review", approvers="refunds", form=FORM, timeout=3600),
            Step("pay", "desk", "pay", policy=POLICY),
        ],
        on_failure=on_failure,
    )


quick = Workflow(
    "quick",
    [
        Step("prepare", "desk", "prepare", policy=POLICY),
        Step.approval("sign", timeout=3600, escalate_after=1.0),
    ],
)

registry = Registry(
    [_refund("refund", "error"), _refund("refund_undo", "compensate"), quick], [desk]
)
