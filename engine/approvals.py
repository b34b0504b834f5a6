"""Approvals (`Step.approval`): an event wait whose event is a person's decision (docs/concepts.md,
"Approvals"). Who may decide is a token scope (`approve`, or `approve:<group>` for a named
group of approvers); the optional form's fields are validated when the person approves, and
become the step's output with the decision. No agent runs the step: it is an event wait on the
reserved event name `sasflow.approval` (no sender may use it), opened with the run's id as its
correlation and decided through `sasflow.ops.approvals`, keyed on the run and the step.

What a decision needs (the group, the form) is written into the step's input when it opens, so
the row alone says who may decide it and what its form is, like an event wait's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sasflow.errors import DefinitionError

APPROVAL_EVENT = "sasflow.approval"
"""The reserved event name of approvals: their step's action; events sent under a `sasflow.`
name are refused, so only a decision completes an approval."""
RESERVED_EVENT_PREFIX = "sasflow."
DEFAULT_GROUP = "approve"
"""`approvers="approve"` (the default): any token with the `approve` scope decides."""
APPROVE_SCOPE = "approve"
GROUP_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,50}$")
RESERVED_FIELDS = frozenset({"decision", "by", "at", "comment"})
"""The output's own keys: no form field may take these names."""
MAX_TEXT = 2000
"""The longest text a form's `str` field, a comment or a reason may hold (characters)."""
_TYPES: dict[type, str] = {str: "str", int: "int", float: "float", bool: "bool"}
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


def scope_of(group: str) -> str:
    """The scope a token needs to decide approvals of `group`."""
    return APPROVE_SCOPE if group == DEFAULT_GROUP else f"{APPROVE_SCOPE}:{group}"


def is_group_scope(scope: str) -> bool:
    """Whether `scope` is a valid `approve:<group>` scope."""
    head, colon, group = scope.partition(":")
    return head == APPROVE_SCOPE and colon == ":" and bool(GROUP_PATTERN.fullmatch(group))


def check_group(group: str) -> str:
    """`group` if it is a valid approvers' group name, else DefinitionError."""
    if not isinstance(group, str) or not GROUP_PATTERN.fullmatch(group):
        raise DefinitionError(
            f"approvers {group!r} must match {GROUP_PATTERN.pattern} (letters, digits, '_', '-')"
        )
    return group


@dataclass(frozen=True)
class FieldSpec:
    """A form field: its type (`str`, `int`, `float`, `bool`, or a list of the allowed texts)
    and whether the approver must fill it in."""

    type: type | Sequence[str]
    required: bool = True

    def to_json(self, name: str) -> dict[str, Any]:
        if isinstance(self.type, type):
            if self.type not in _TYPES:
                raise DefinitionError(
                    f"form field {name!r}: type must be str, int, float, bool or a list of "
                    f"choices, got {self.type!r}"
                )
            return {"type": _TYPES[self.type], "required": self.required}
        choices = list(self.type)
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise DefinitionError(f"form field {name!r}: choices must be non-empty texts")
        return {"type": "choice", "choices": choices, "required": self.required}


@dataclass(frozen=True)
class ApprovalSpec:
    """An approval's definition (`Step.approval`)."""

    group: str
    form: tuple[tuple[str, dict[str, Any]], ...]
    """(field name, its JSON description), in declaration order."""
    escalate_after: float | None

    @classmethod
    def of(
        cls,
        step: str,
        approvers: str,
        form: Mapping[str, FieldSpec | type | Sequence[str]] | None,
        escalate_after: float | None,
    ) -> ApprovalSpec:
        try:
            check_group(approvers)
        except DefinitionError as exc:
            raise DefinitionError(f"approval {step!r}: {exc}") from None
        if escalate_after is not None and not _positive(escalate_after):
            raise DefinitionError(
                f"approval {step!r}: escalate_after must be > 0 seconds, got {escalate_after!r}"
            )
        fields = []
        for name, spec in (form or {}).items():
            if not isinstance(name, str) or not GROUP_PATTERN.fullmatch(name):
                raise DefinitionError(
                    f"approval {step!r}: form field {name!r} must match {GROUP_PATTERN.pattern}"
                )
            if name in RESERVED_FIELDS:
                raise DefinitionError(
                    f"approval {step!r}: form field {name!r} is reserved "
                    f"({', '.join(sorted(RESERVED_FIELDS))} are the decision's own)"
                )
            field = spec if isinstance(spec, FieldSpec) else FieldSpec(spec)
            try:
                fields.append((name, field.to_json(name)))
            except DefinitionError as exc:
                raise DefinitionError(f"approval {step!r}: {exc}") from None
        return cls(approvers, tuple(fields), None if escalate_after is None else escalate_after)

    def input(self) -> dict[str, Any]:
        """What the step's input holds of it once open (`approval` key)."""
        return {
            "group": self.group,
            "scope": scope_of(self.group),
            "form": dict(self.form),
            "escalate_after_s": self.escalate_after,
        }

    def shape(self) -> dict[str, Any]:
        """What a workflow's fingerprint takes of it."""
        return {"group": self.group, "form": dict(self.form), "escalate": self.escalate_after}


def _positive(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def validate_form(
    form: Mapping[str, Any], values: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The form's values checked and converted (`values` from JSON, or texts from a command line
    or an HTML form): (clean values, field -> reason). A blank text is an empty field."""
    clean: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name in values:
        if name not in form:
            errors[name] = "not a field of this approval's form"
    for name, spec in form.items():
        raw = values.get(name)
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            if spec.get("required", True):
                errors[name] = "required"
            continue
        try:
            clean[name] = _convert(spec, raw)
        except ValueError as exc:
            errors[name] = str(exc)
    return clean, errors


def _convert(spec: Mapping[str, Any], raw: Any) -> Any:  # noqa: PLR0911, PLR0912 - one per type
    kind = spec.get("type")
    text = raw.strip() if isinstance(raw, str) else None
    if kind == "str":
        if text is None or len(raw) > MAX_TEXT:
            raise ValueError(f"must be a text of at most {MAX_TEXT} characters")
        return raw
    if kind == "choice":
        choices = spec.get("choices", [])
        if raw not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return raw
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if text is not None and text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ValueError("must be true or false")
    if kind == "int":
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if text is not None and re.fullmatch(r"[+-]?\d{1,18}", text):
            return int(text)
        raise ValueError("must be a whole number")
    if isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw):
        return float(raw)
    try:
        number = float(text) if text is not None else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError("must be a number")
    return number
