"""Several URLs in one setting: where one ends and the next begins.

A list is its URLs separated by commas, with optional whitespace around each comma; a comma
separates only where a URL (`scheme://`) follows it, so a comma inside a password stays in
that URL. Shared by the broker list's parsing and by the redaction of any URL setting, so
that both cut a list at the same places.
"""

from __future__ import annotations

import re

SEPARATOR = re.compile(r"\s*,\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")
"""A comma (and the whitespace around it) followed by the next URL's scheme."""


def split_urls(text: str) -> list[str]:
    """The entries of `text`, stripped; one entry when it holds no separator."""
    return [part.strip() for part in SEPARATOR.split(text.strip())]


def pieces(text: str) -> list[str]:
    """`text` cut into entries and the separators between them (odd indexes), so that
    `"".join(pieces(text)) == text`."""
    out: list[str] = []
    start = 0
    for match in SEPARATOR.finditer(text):
        out += [text[start : match.start()], match.group()]
        start = match.end()
    out.append(text[start:])
    return out
