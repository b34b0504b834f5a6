"""Schemathesis hooks of the fuzz test (tests/api/test_fuzz.py), loaded through
SCHEMATHESIS_HOOKS: a SUBSCRIBE that the server would accept opens a stream that never ends,
so such cases are not sent (the stream has its own tests); every other call is."""

from __future__ import annotations

from typing import Any

import schemathesis

from sasflow.api.stream.calls import Subscribe, parse_call
from sasflow.errors import InvalidMessageError


def opens_a_stream(body: Any) -> bool:
    """Whether `body` is a well-formed SUBSCRIBE: a call answered with an endless stream."""
    if not isinstance(body, dict) or body.get("type") != "SUBSCRIBE":
        return False
    try:
        return isinstance(parse_call(body), Subscribe)
    except InvalidMessageError:
        return False


@schemathesis.hook
def filter_body(context: Any, body: Any) -> bool:
    """Generated bodies (fuzzing, stateful phases)."""
    del context
    return not opens_a_stream(body)


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    """Whole cases (the examples and coverage phases)."""
    del context
    return not opens_a_stream(case.body)
