"""An alert's cause: what groups alerts into one incident (docs/alerts.md#incidents).

Pure: the cause is computed from the alert alone, when it is raised. A failure's cause is
(kind, workflow, step, error type, the error message with its numbers, ids and UUIDs
stripped, bounded); every other kind its natural subject (the agent, the scheduler, the
callback's host). The readable form is what operators see; its SHA-256 is the key the open
incident is unique on (bounded whatever the parts' lengths).
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

MESSAGE_CHARS = 120
"""A normalised error message is cut to this many characters."""
CAUSE_CHARS = 400
"""The readable cause is cut to this many characters (its key hashes the whole)."""

_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)
_HEX = re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b", re.I)
_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_QUOTED = re.compile(r"(?<!\w)'[^']*'(?!\w)|\"[^\"]*\"")
"""A quoted value; an apostrophe inside a word (the step's, don't) opens no quote."""
_SPACE = re.compile(r"\s+")


def normalise(message: str) -> str:
    """`message` with its variable parts replaced: UUIDs and long hex ids by `<id>`, numbers by
    `<n>`, quoted values by `<v>`; blanks collapsed; at most MESSAGE_CHARS characters."""
    text = _UUID.sub("<id>", message)
    text = _HEX.sub("<id>", text)
    text = _QUOTED.sub("<v>", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACE.sub(" ", text).strip()[:MESSAGE_CHARS]


@dataclass(frozen=True)
class Cause:
    """What an incident groups: its readable form and the key of that form."""

    text: str
    """Readable, at most CAUSE_CHARS characters."""
    key: str
    """The SHA-256 (hex) of the whole readable form: what the open incident is unique on."""

    @classmethod
    def of(cls, text: str) -> Cause:
        return cls(text[:CAUSE_CHARS], hashlib.sha256(text.encode("utf-8")).hexdigest())


def _error_of(detail: Any) -> tuple[str | None, Any]:
    """(step, error) of a run's stored error: `{"step", "error"}` or the run's own error."""
    if isinstance(detail, dict) and isinstance(detail.get("step"), str):
        return detail["step"], detail.get("error")
    return None, detail


def _failure(kind: str, workflow: str | None, detail: Any) -> str:
    step, error = _error_of(detail)
    if isinstance(error, dict):
        kind_of_error = str(error.get("type") or "error")
        message = normalise(str(error.get("message") or ""))
    else:
        kind_of_error, message = "error", normalise("" if error is None else str(error))
    where = f"step {step!r}" if step is not None else "the run level"
    return f"{kind} in {workflow or '?'} at {where}: {kind_of_error}: {message}"


def cause_of(kind: str, subject: str, workflow: str | None, detail: Any) -> Cause:
    """The cause of an alert of `kind` about `subject` (see the module docstring)."""
    if kind in {"step_failed", "compensation_failed", "step_parked"} and workflow is not None:
        text = _failure(kind, workflow, detail)
    elif kind == "agent_lost" and isinstance(detail, dict) and detail.get("agent"):
        text = f"{kind} of agent {detail['agent']}"
    elif kind == "callback_failed" and isinstance(detail, dict) and detail.get("url"):
        parts = urllib.parse.urlsplit(str(detail["url"]))
        text = f"{kind} to {parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    elif kind == "approval_overdue" and workflow is not None and isinstance(detail, dict):
        text = f"{kind} in {workflow} at step {detail.get('step')!r}"
    elif kind == "run_deadline" and workflow is not None:
        text = f"{kind} in {workflow}"
    else:  # its own subject: one agent, one scheduler, one subscriber, the broker (and a
        # failure of no known workflow: nothing says two of them have one cause)
        text = f"{kind} of {subject}"
    return Cause.of(text)
