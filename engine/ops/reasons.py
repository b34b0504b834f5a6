"""What an operator's reason must be, wherever one is given (CLI, API, console): text, at
most `REASON_MAX` characters. Reasons are audited and shown to the next operator."""

from __future__ import annotations

REASON_MAX = 2000


def has_text(value: str) -> bool:
    """At least one character that is neither blank nor a control character."""
    return any(ch.isprintable() and not ch.isspace() for ch in value)
