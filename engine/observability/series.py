"""A labelled metric's series (children), looked up once per label values and then cached.

prometheus-client's `metric.labels(*values)` validates, converts every value to `str` and takes
the metric's lock on every call (about 2-5 us); the roles' hooks call it for each reply, run
and handler. `Series.of(*values)` answers from a dict after the first call for those values (a
fraction of a microsecond), and a new combination of values still gets its own series.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

M = TypeVar("M", Counter, Gauge, Histogram)


class Series(Generic[M]):
    """The children of `metric` by label values. Safe from any thread: two threads asking for a
    new combination at once both get the one child prometheus-client keeps for it. Values
    must be `str` (or a `StrEnum`, which equals and hashes as its value)."""

    def __init__(self, metric: M) -> None:
        self.metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def of(self, *values: str) -> M:
        """The child of `metric` for `values` (its labels, in their declared order)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child
