"""How the demo shows itself: a rich Live view on a terminal, plain lines anywhere else.

Non-terminal output (CI logs, pipes) gets one line per piece of news and a progress line
every few seconds: no cursor movement, no colour codes.
"""

from __future__ import annotations

import collections
import time
from typing import Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from sasflow.demo.feed import News
from sasflow.states import TERMINAL_RUN_STATES, RunState
from sasflow.store.operator.waiting import Waiting

STATE_ORDER = (
    RunState.PENDING,
    RunState.RUNNING,
    RunState.COMPENSATING,
    RunState.COMPLETED,
    RunState.COMPENSATED,
    RunState.ERROR,
    RunState.COMPENSATION_FAILED,
    RunState.CANCELLED,
)
STYLES = {
    "breaker": "yellow",
    "retry": "yellow",
    "expiry": "magenta",
    "crash": "red",
    "outage": "red",
    "compensation": "cyan",
    "error": "red",
    "alert": "bold red",
    "event": "green",
}
RECENT = 12
PLAIN_PROGRESS_SECONDS = 2.0


class Display(Protocol):
    def update(self, states: dict[str, int], news: list[News], waits: list[Waiting]) -> None: ...

    def close(self) -> None: ...


def _finished(states: dict[str, int]) -> int:
    return sum(n for s, n in states.items() if s in TERMINAL_RUN_STATES)


def describe(waiting: Waiting) -> str:
    """`3 waiting for payment_confirmed` or `2 sleeping until 12:00:01.500` (UTC)."""
    if waiting.kind == "event":
        return f"{waiting.count} waiting for {waiting.event}"
    return f"{waiting.count} sleeping until {waiting.next_due:%H:%M:%S.%f}"[:-3]


def _ordered(states: dict[str, int]) -> list[tuple[str, int]]:
    known = [(s, states[s]) for s in STATE_ORDER if s in states]
    return known + sorted((s, n) for s, n in states.items() if s not in STATE_ORDER)


class LiveDisplay:
    """Runs by state with a progress bar, and the latest news, redrawn in place."""

    def __init__(self, console: Console, orders: int) -> None:
        self._console = console
        self._orders = orders
        self._recent: collections.deque[News] = collections.deque(maxlen=RECENT)
        self._states: dict[str, int] = {}
        self._waits: list[Waiting] = []
        self._started = time.monotonic()
        self._live = Live(self._render(), console=console, refresh_per_second=8, transient=False)
        self._live.start()

    def _render(self) -> Group:
        finished = _finished(self._states)
        header = Text.assemble(
            ("sasflow demo ", "bold"),
            f"{finished}/{self._orders} orders finished, {time.monotonic() - self._started:.1f}s",
        )
        states = Table(show_header=True, header_style="bold", box=None)
        states.add_column("runs by state")
        states.add_column("count", justify="right")
        for state, count in _ordered(self._states):
            states.add_row(state, str(count))
        waits = Table(show_header=True, header_style="bold", box=None)
        waits.add_column("step")
        waits.add_column("waiting now")
        for waiting in self._waits:
            waits.add_row(waiting.step, describe(waiting))
        news = Table(show_header=True, header_style="bold", box=None)
        news.add_column("what just happened")
        for item in self._recent:
            news.add_row(Text(item.text, style=STYLES.get(item.kind, "")))
        return Group(
            header,
            ProgressBar(total=self._orders, completed=finished, width=50),
            states,
            waits,
            news,
        )

    def update(self, states: dict[str, int], news: list[News], waits: list[Waiting]) -> None:
        self._states = states
        self._waits = waits
        self._recent.extend(news)
        self._live.update(self._render())

    def close(self) -> None:
        self._live.stop()


class PlainDisplay:
    """One line per piece of news, and a progress line (with the steps sleeping or waiting for
    an event) when the counts changed."""

    def __init__(self, console: Console, orders: int) -> None:
        self._console = console
        self._orders = orders
        self._last: dict[str, int] = {}
        self._last_at = 0.0
        self._started = time.monotonic()

    def update(self, states: dict[str, int], news: list[News], waits: list[Waiting]) -> None:
        elapsed = time.monotonic() - self._started
        for item in news:
            self._console.print(
                f"[{elapsed:5.1f}s] {item.kind}: {item.text}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        now = time.monotonic()
        if states != self._last and now - self._last_at >= PLAIN_PROGRESS_SECONDS:
            self._last, self._last_at = dict(states), now
            counts = ", ".join(f"{s} {n}" for s, n in _ordered(states))
            waiting = "".join(f"; {w.step}: {describe(w)}" for w in waits)
            self._console.print(
                f"[{elapsed:5.1f}s] progress: {_finished(states)}/"
                f"{self._orders} finished ({counts}){waiting}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    def close(self) -> None:
        return None


class QuietDisplay:
    """Shows nothing (for --json)."""

    def update(self, states: dict[str, int], news: list[News], waits: list[Waiting]) -> None:  # noqa: ARG002
        return None

    def close(self) -> None:
        return None


def make_display(console: Console, orders: int, *, quiet: bool) -> Display:
    if quiet:
        return QuietDisplay()
    if console.is_terminal:
        return LiveDisplay(console, orders)
    return PlainDisplay(console, orders)
