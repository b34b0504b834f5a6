"""Hide passwords in connection strings before they reach a log or a terminal."""

from __future__ import annotations

import re

from sasflow.urllist import pieces

# scheme://user:password@host...; the password runs to the entry's last "@" (it may hold
# / ? # and @ itself).
_CREDENTIALS = re.compile(
    r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@]*:)(?P<pw>.*)@(?P<tail>[^@]*)$", re.DOTALL
)


def redact_url(url: str) -> str:
    """Return `url` with the password (if any) replaced by ***; in a list of URLs (comma-
    separated, as SASFLOW_BROKER_URL takes), each one's."""
    parts = pieces(url)
    parts[::2] = [_redact_one(part) for part in parts[::2]]
    return "".join(parts)


def _redact_one(url: str) -> str:
    match = _CREDENTIALS.match(url)
    if match is None:
        return url
    return f"{match['head']}***@{match['tail']}"


# a URL's credentials anywhere in a text (a traceback, a message): scheme://user:password@
_CREDENTIALS_IN_TEXT = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*:)[^@\s/]*@")


def redact_text(text: str) -> str:
    """Return `text` with the password of every URL in it replaced by ***."""
    return _CREDENTIALS_IN_TEXT.sub(r"\g<head>***@", text)
