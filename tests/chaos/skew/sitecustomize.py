"""Loaded at start-up by the chaos suite's skewed processes (their PYTHONPATH starts with this
folder): the process's wall clock runs SASFLOW_CHAOS_CLOCK_SKEW seconds off, as on a host whose
clock drifted. Only the wall clock: a real host's monotonic clock is not skewed, and faking it
(libfaketime does) hangs Python's timed waits."""

from __future__ import annotations

import datetime as dt
import os
import time

_SKEW = float(os.environ.get("SASFLOW_CHAOS_CLOCK_SKEW", "0"))

if _SKEW:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _SKEW
    time.time_ns = lambda: _time_ns() + int(_SKEW * 1e9)

    class _SkewedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> _SkewedDatetime:
            return super().now(tz) + dt.timedelta(seconds=_SKEW)

        @classmethod
        def utcnow(cls) -> _SkewedDatetime:
            return cls.now(dt.UTC).replace(tzinfo=None)

    dt.datetime = _SkewedDatetime  # type: ignore[misc]
