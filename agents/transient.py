"""Which failures of the common HTTP clients are worth retrying, without importing them.

httpx, requests, urllib3 and urllib raise their own exception classes, most of which are not
the built-in `ConnectionError` or `TimeoutError` (`httpx.ConnectError` is not): an agent that
only retried those would fail a step for good on the first refused connection. The classes are
recognised by their module and name along the exception's MRO, so `import sasflow.agents`
loads none of these libraries and an agent that uses none of them pays nothing.

Transient: a connection refused, reset or timed out, a broken response (httpx
`RemoteProtocolError`, urllib3 `ProtocolError`, requests `ChunkedEncodingError`), and an HTTP
status answer in `TransientHttp.statuses` (408, 429 and the 5xx but 501 and 505) raised by
`raise_for_status()` or urllib. A `Retry-After` header (seconds or an HTTP date) on such an
answer is honoured: the next try waits at least that long, or the step is deferred when it
does not fit in the deadline (docs/agents.md).
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sasflow.errors import DefinitionError

DEFAULT_STATUSES: frozenset[int] = frozenset({408, 429, *range(500, 600)} - {501, 505})
"""HTTP statuses retried by default: request timeout, too many requests, and the server errors
but "not implemented" and "HTTP version not supported" (retrying cannot change those)."""

_NETWORK: dict[str, frozenset[str]] = {
    # module -> class names (any class of the exception's MRO) that mean the network failed
    "httpx": frozenset({"TimeoutException", "NetworkError", "RemoteProtocolError"}),
    # RetryError / ResponseError: the client's own retries saw only retried statuses
    "requests.exceptions": frozenset(
        {"ConnectionError", "Timeout", "ChunkedEncodingError", "RetryError"}
    ),
    "urllib3.exceptions": frozenset({"TimeoutError", "ProtocolError", "ResponseError"}),
}
_NEVER: dict[str, frozenset[str]] = {
    # subclasses of the above that retrying cannot fix (a certificate, a proxy's refusal)
    "requests.exceptions": frozenset({"SSLError", "ProxyError"}),
}
_STATUS_ERRORS: dict[str, frozenset[str]] = {
    "httpx": frozenset({"HTTPStatusError"}),
    "requests.exceptions": frozenset({"HTTPError"}),
    "urllib.error": frozenset({"HTTPError"}),
}
_WRAPPERS: dict[str, frozenset[str]] = {
    # errors whose `reason` is the failure that counts
    "urllib3.exceptions": frozenset({"MaxRetryError"}),
    "urllib.error": frozenset({"URLError"}),
}


def _names(exc: BaseException) -> Iterator[tuple[str, str]]:
    for cls in type(exc).__mro__:
        module = cls.__module__
        # httpx names its public classes' module "httpx"; a version that did not would say
        # where they are defined (httpx._exceptions)
        yield ("httpx" if module.startswith("httpx.") else module), cls.__name__


def _is(exc: BaseException, table: dict[str, frozenset[str]]) -> bool:
    return any(name in table.get(module, ()) for module, name in _names(exc))


def _response(exc: BaseException) -> tuple[int | None, Any]:
    """The HTTP status and headers an exception carries (httpx, requests: `response`;
    urllib: `code` and `headers`)."""
    response = getattr(exc, "response", None)
    if response is not None:
        status = getattr(response, "status_code", None)
        return (status if isinstance(status, int) else None), getattr(response, "headers", None)
    code = getattr(exc, "code", None)
    return (code if isinstance(code, int) else None), getattr(exc, "headers", None)


def parse_retry_after(value: str, *, now: float | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` value: delay-seconds or an HTTP date (compared with
    this machine's wall clock, the only clock the remote server's date can be read against);
    None when it is neither. A date in the past is 0."""
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None  # RFC 9110 dates are GMT; one without a zone is not a valid HTTP date
    wait = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, wait) if math.isfinite(wait) else None


@dataclass(frozen=True)
class TransientHttp:
    """Which failures of HTTP clients (httpx, requests, urllib3, urllib) an agent retries.

    `Agent(name, http=TransientHttp(statuses=frozenset({503})))` narrows the statuses;
    `Agent(name, http=None)` retries none of them (only `transient` and TransientError)."""

    statuses: frozenset[int] = DEFAULT_STATUSES
    """HTTP statuses of a status error (`raise_for_status()`) that are retried."""
    network: bool = True
    """Retry refused or reset connections, timeouts and broken responses."""
    retry_after: bool = True
    """Honour a `Retry-After` header on a retried status: wait at least that long, or defer
    the step when the wait does not fit in its deadline."""

    def __post_init__(self) -> None:
        statuses = frozenset(self.statuses)  # a set given where a frozenset is typed: hashable
        wrong = sorted(str(s) for s in statuses if not isinstance(s, int) or not 100 <= s <= 599)
        if wrong:
            raise DefinitionError(f"TransientHttp: statuses must be HTTP statuses, got {wrong}")
        object.__setattr__(self, "statuses", statuses)

    def is_transient(self, exc: BaseException) -> bool:
        if _is(exc, _STATUS_ERRORS):
            status, _ = _response(exc)
            return status is not None and status in self.statuses
        if _is(exc, _WRAPPERS):
            reason = getattr(exc, "reason", None)
            if isinstance(reason, ConnectionError | TimeoutError):
                return self.network
            return isinstance(reason, BaseException) and self.is_transient(reason)
        return self.network and _is(exc, _NETWORK) and not _is(exc, _NEVER)

    def retry_after_of(self, exc: BaseException) -> float | None:
        """Seconds the server asked to wait before the next try (a retried status's
        `Retry-After`), or None."""
        if not self.retry_after or not _is(exc, _STATUS_ERRORS):
            return None
        status, headers = _response(exc)
        if status is None or status not in self.statuses or headers is None:
            return None
        value = headers.get("Retry-After")
        return parse_retry_after(value) if isinstance(value, str) else None
