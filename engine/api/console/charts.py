"""The workflow page's charts as geometry for inline SVG, drawn on the server (no JavaScript
library): throughput as bars (the failed runs' share in red at their foot), the failure rate
and the p50/p95 durations as lines with a point per bucket that has finished runs. The page's
table carries the same figures for screen readers and text browsers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sasflow.store.operator.charts import Bucket, Series

SLOT = 16
"""Width of one bucket, px."""
HEIGHT = 140
"""Height of the plotting area, px."""
LEFT = 48
"""Room for the y axis' labels, px."""
BOTTOM = 20
TOP = 8


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    css: str
    title: str


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    title: str


@dataclass(frozen=True)
class Line:
    css: str
    label: str
    points: tuple[Point, ...]

    @property
    def path(self) -> str:
        """The SVG polyline's points."""
        return " ".join(f"{p.x:.1f},{p.y:.1f}" for p in self.points)


@dataclass(frozen=True)
class Tick:
    at: float
    label: str


@dataclass(frozen=True)
class Chart:
    """One chart: its size, its marks and its axes' labels."""

    name: str
    width: float
    height: float
    bars: tuple[Bar, ...]
    lines: tuple[Line, ...]
    y_ticks: tuple[Tick, ...]
    x_ticks: tuple[Tick, ...]

    @property
    def empty(self) -> bool:
        return not self.bars and not any(line.points for line in self.lines)


def charts(series: Series) -> tuple[Chart, Chart, Chart]:
    """Throughput, failure rate and duration of the series."""
    return _throughput(series), _failure_rate(series), _durations(series)


def _x(i: int) -> float:
    return LEFT + i * SLOT


def _y(value: float, top: float) -> float:
    """The y of `value` on an axis from 0 to `top`."""
    return TOP + HEIGHT - (value / top) * HEIGHT if top else TOP + HEIGHT


def _x_ticks(series: Series) -> tuple[Tick, ...]:
    """About six time labels (UTC) along the bottom."""
    count = len(series.buckets)
    step = max(1, count // 6)
    long = series.bucket_s * count > 86400
    shape = "%m-%d %H:%M" if long else "%H:%M"
    return tuple(
        Tick(_x(i), series.buckets[i].start.strftime(shape)) for i in range(0, count, step)
    )


def _scale(top: float, render: Callable[[float], str]) -> tuple[float, tuple[Tick, ...]]:
    """A round top for the axis and its three labels."""
    nice = _nice(top)
    return nice, tuple(Tick(_y(v, nice), render(v)) for v in (0, nice / 2, nice))


def _nice(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above `value` (1 for nothing)."""
    if value <= 0:
        return 1.0
    scale = 1.0
    while scale * 10 <= value:
        scale *= 10
    while scale > value:
        scale /= 10
    for step in (1, 2, 5, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale  # pragma: no cover - the loop always returns


def _frame(
    name: str, series: Series, bars: Sequence[Bar], lines: Sequence[Line], y: tuple[Tick, ...]
) -> Chart:
    return Chart(
        name=name,
        width=_x(len(series.buckets)) + 8,
        height=TOP + HEIGHT + BOTTOM,
        bars=tuple(bars),
        lines=tuple(lines),
        y_ticks=y,
        x_ticks=_x_ticks(series),
    )


def _when(bucket: Bucket) -> str:
    return bucket.start.strftime("%Y-%m-%d %H:%M UTC")


def _throughput(series: Series) -> Chart:
    top, y_ticks = _scale(max((b.finished for b in series.buckets), default=0), _count)
    bars = []
    for i, b in enumerate(series.buckets):
        if not b.finished:
            continue
        title = f"{_when(b)}: {b.finished} finished, {b.failed} failed"
        x = _x(i) + 1
        done = _y(b.finished, top)
        bars.append(Bar(x, done, SLOT - 2, TOP + HEIGHT - done, "bar", title))
        if b.failed:
            failed = _y(b.failed, top)
            bars.append(Bar(x, failed, SLOT - 2, TOP + HEIGHT - failed, "bar-failed", title))
    return _frame("throughput", series, bars, (), y_ticks)


def _failure_rate(series: Series) -> Chart:
    _, y_ticks = _scale(1.0, _percent)
    points = tuple(
        Point(_x(i) + SLOT / 2, _y(b.failure_rate, 1.0), f"{_when(b)}: {_percent(b.failure_rate)}")
        for i, b in enumerate(series.buckets)
        if b.failure_rate is not None
    )
    return _frame("failure rate", series, (), (Line("rate", "failure rate", points),), y_ticks)


def _durations(series: Series) -> Chart:
    highest = max((b.p95_s or 0.0 for b in series.buckets), default=0.0)
    top, y_ticks = _scale(highest, _seconds)

    def line(css: str, label: str, pick: Callable[[Bucket], float | None]) -> Line:
        points = []
        for i, b in enumerate(series.buckets):
            value = pick(b)
            if value is not None:
                title = f"{_when(b)}: {label} {_seconds(value)}"
                points.append(Point(_x(i) + SLOT / 2, _y(value, top), title))
        return Line(css, label, tuple(points))

    lines = (line("p50", "p50", lambda b: b.p50_s), line("p95", "p95", lambda b: b.p95_s))
    return _frame("duration", series, (), lines, y_ticks)


def _count(value: float) -> str:
    return f"{value:g}"


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value * 100:.0f} %"


def _seconds(value: float | None) -> str:
    """A duration as people read it: ms under a second, s under two minutes, else min."""
    if value is None:
        return ""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


FORMATS = {"percent": _percent, "seconds": _seconds}
"""The table's formats, for the template."""
