"""A handler's traceback as the step's error keeps it: its own frames, bounded, redacted.

The frames of the agent's machinery (the worker, tenacity, the breaker, the event loop) that
led to the handler are cut: the traceback starts at the handler's own frame. It keeps the
last `MAX_FRAMES` frames of each exception of the chain (`raise ... from`) and the last
`MAX_TRACEBACK_CHARS` characters, where the exception's line is; passwords in URLs are hidden.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import CodeType, TracebackType
from typing import Any

from sasflow.messages import MAX_TRACEBACK_CHARS, safe_text
from sasflow.redact import redact_text

MAX_FRAMES = 30
_CUT = "... (cut)\n"


def _code(function: Callable[..., Any]) -> CodeType | None:
    code = getattr(inspect.unwrap(function), "__code__", None)
    if code is None:  # a callable object: its __call__
        code = getattr(getattr(function, "__call__", None), "__code__", None)  # noqa: B004
    return code if isinstance(code, CodeType) else None


def _from_handler(tb: TracebackType | None, code: CodeType | None) -> TracebackType | None:
    """The traceback from the handler's frame on, or all of it when that frame is not in it."""
    if code is None:
        return tb
    start = tb
    while start is not None and start.tb_frame.f_code is not code:
        start = start.tb_next
    return start if start is not None else tb


def handler_traceback(exc: BaseException, handler: Callable[..., Any]) -> str:
    """`exc`'s traceback from `handler`'s frame on, bounded and redacted."""
    tb = _from_handler(exc.__traceback__, _code(handler))
    found = traceback.TracebackException(type(exc), exc, tb, limit=-MAX_FRAMES, compact=True)
    _name_files(found, _import_roots(sys.path))
    return tail(redact_text("".join(found.format())))


def _import_roots(path: Sequence[str]) -> list[str]:
    """The absolute directories of the import path, each ending with a separator, longest first."""
    roots = {str(Path(entry).absolute()).rstrip(os.sep) + os.sep for entry in path if entry}
    return sorted(roots, key=len, reverse=True)


def relative_file(filename: str, roots: Sequence[str]) -> str:
    """`filename` from the longest import root it lies under; as it is when under none."""
    for root in roots:
        if filename.startswith(root):
            return filename[len(root) :]
    return filename


def _name_files(found: traceback.TracebackException, roots: Sequence[str]) -> None:
    """Name every frame's file of `found` and of its chain from its import root."""
    seen: set[int] = set()
    pending: list[traceback.TracebackException | None] = [found]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        for frame in current.stack:
            frame.filename = relative_file(frame.filename, roots)
        pending += [current.__cause__, current.__context__]


def tail(text: str, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """`text` made storable (sasflow.messages.safe_text), cut to its last `limit` characters."""
    text = safe_text(text, len(text) * 10)
    if len(text) <= limit:
        return text
    return _CUT + text[len(text) - limit + len(_CUT) :]
