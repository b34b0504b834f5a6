"""Approvals' definitions (`Step.approval`), their scopes and their forms' validation, without
I/O."""

from __future__ import annotations

from typing import Any

import pytest

from sasflow import DefinitionError, FieldSpec, Step, Workflow
from sasflow.approvals import is_group_scope, scope_of, validate_form
from sasflow.errors import InvalidEventError
from sasflow.ops.approvals import may_decide
from sasflow.store.inbound.ingest import InboundEvent

FORM = Step.approval(
    "review",
    form={
        "amount": int,
        "rate": float,
        "ok": bool,
        "channel": ["card", "bank"],
        "note": FieldSpec(str, required=False),
    },
    timeout=60,
).approval_spec


def _flow(*approval: Step) -> Workflow:
    return Workflow("refund", [Step("a", "desk", "prepare"), *approval])


def test_a_form_converts_texts_and_names_every_refused_field() -> None:
    assert FORM is not None
    form = FORM.input()["form"]
    clean, refused = validate_form(
        form, {"amount": "120", "rate": "0.5", "ok": "yes", "channel": "card"}
    )
    assert (clean, refused) == ({"amount": 120, "rate": 0.5, "ok": True, "channel": "card"}, {})
    _, refused = validate_form(
        form, {"amount": 1.5, "rate": "nan", "ok": "maybe", "channel": "cash", "x": 1}
    )
    assert refused == {
        "amount": "must be a whole number",
        "rate": "must be a number",
        "ok": "must be true or false",
        "channel": "must be one of card, bank",
        "x": "not a field of this approval's form",
    }
    _, refused = validate_form(form, {"note": "only this"})
    assert set(refused) == {"amount", "rate", "ok", "channel"}
    assert set(refused.values()) == {"required"}


def test_groups_are_scopes_and_the_plain_approve_scope_is_the_default_group_only() -> None:
    assert scope_of("approve") == "approve"
    assert scope_of("refunds") == "approve:refunds"
    assert is_group_scope("approve:refunds")
    assert not is_group_scope("approve:")
    assert not is_group_scope("approve:a b")
    assert not is_group_scope("operate:refunds")
    assert may_decide({"approve:refunds"}, "refunds")
    assert not may_decide({"approve", "approve:other"}, "refunds")
    assert may_decide({"approve"}, "approve")
    assert may_decide({"admin"}, "refunds")
    assert not may_decide({"read", "operate"}, "approve")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"approvers": "re funds"}, "approvers 're funds' must match"),
        ({"form": {"decision": str}}, "'decision' is reserved"),
        ({"form": {"amount": dict}}, "type must be str, int, float, bool"),
        ({"form": {"kind": []}}, "choices must be non-empty texts"),
        ({"escalate_after": 0}, "escalate_after must be > 0"),
        ({"timeout": -1}, "timeout must be > 0"),
    ],
)
def test_a_bad_approval_is_refused_at_definition(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        Step.approval("review", **{"timeout": 60, **kwargs})


def test_an_approval_is_an_event_wait_that_only_step_approval_declares() -> None:
    step = Step.approval("review", approvers="refunds", timeout=60)
    assert step.is_event_wait
    assert step.is_approval
    with pytest.raises(DefinitionError, match="cannot be a root step"):
        Workflow("refund", [step])
    with pytest.raises(DefinitionError, match="are reserved"):
        Step.wait_for("x", event="sasflow.approval", match="input.id", timeout=60)
    with pytest.raises(InvalidEventError, match="reserved"):
        InboundEvent.from_json({"name": "sasflow.approval", "correlation": "1", "id": "e"})


def test_the_fingerprint_takes_the_approvals_group_form_and_escalation() -> None:
    base = _flow(Step.approval("review", timeout=60)).fingerprint
    assert _flow(Step.approval("review", timeout=60)).fingerprint == base
    for other in (
        Step.approval("review", approvers="refunds", timeout=60),
        Step.approval("review", form={"amount": int}, timeout=60),
        Step.approval("review", escalate_after=30, timeout=60),
    ):
        assert _flow(other).fingerprint != base
