"""Hide passwords in connection strings before they reach a log or a terminal."""

from __future__ import annotations

import re

# scheme://user:password@host...; the password runs to the last "@" (it may hold / ? #).
_CREDENTIALS = re.compile(
    r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@]*:)(?P<pw>.*)@(?P<tail>[^@]*)$", re.DOTALL
)


def redact_url(url: str) -> str:
    """Return `url` with the password (if any) replaced by ***."""
    match = _CREDENTIALS.match(url)
    if match is None:
        return url
    return f"{match['head']}***@{match['tail']}"
