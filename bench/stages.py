"""Stage stamps of W3's path (`python bench/latency.py --stages`): where one run's time goes.

Bench-only: a `Hooks` subclass for the events the hooks seam has (claim, dispatch confirmed,
apply committed) and wrappers on one scheduler instance's attributes for those it has not (the
LISTEN thread's wake-up, a reply's delivery, the publish of the run's `completed` event). Runs go
one at a time, so every stamp belongs to the run submitted last (`begin`); the first stamp of a
stage wins (with two schedulers both are woken). Stamps are `time.perf_counter()`, the clock of
the bench's own submit, handler and observed stamps.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from sasflow.hooks import Hooks
from sasflow.scheduler.loop import Scheduler

STAGES = (
    ("submit", "submit started (bench)"),
    ("notify", "NOTIFY received by a LISTEN thread"),
    ("claim_start", "claim transaction started"),
    ("claimed", "claim statement done (commit follows)"),
    ("confirmed", "request published and confirmed"),
    ("handler", "handler started (agent)"),
    ("reply", "reply delivered to the scheduler"),
    ("apply_start", "apply transaction started"),
    ("applied", "apply committed"),
    ("published", "run.completed event published"),
    ("observed", "run.completed event received (bench)"),
)


class Stages(Hooks):
    """Collects each run's stamps; `table()` prints the median gap between stages."""

    def __init__(self) -> None:
        self._runs: list[dict[str, float]] = []

    def begin(self) -> None:
        """The bench is about to submit the next run."""
        self._runs.append({"submit": time.perf_counter()})

    def stamp(self, stage: str, at: float | None = None) -> None:
        if self._runs:
            self._runs[-1].setdefault(stage, time.perf_counter() if at is None else at)

    def add(self, run: int, stage: str, at: float) -> None:
        """A stamp the bench took itself (handler start, observed), by submission index."""
        if run < len(self._runs):
            self._runs[run].setdefault(stage, at)

    # -- hooks ----------------------------------------------------------------------------

    def steps_claimed(
        self,
        conn: Any,  # noqa: ARG002 - the hook's signature
        steps: Sequence[Any],
        seconds: float,
    ) -> None:
        if steps:
            now = time.perf_counter()
            self.stamp("claim_start", now - seconds)
            self.stamp("claimed", now)

    def steps_dispatched(self, count: int, seconds: float) -> None:  # noqa: ARG002
        if count:
            self.stamp("confirmed")

    def replies_applied(
        self,
        replies: Sequence[Any],  # noqa: ARG002 - the hook's signature
        report: Any,  # noqa: ARG002 - the hook's signature
        seconds: float,
    ) -> None:
        now = time.perf_counter()
        self.stamp("apply_start", now - seconds)
        self.stamp("applied", now)

    # -- wrappers -------------------------------------------------------------------------

    def attach(self, scheduler: Scheduler) -> None:
        """Stamp the wake-up, the reply's delivery and the completed event's publish."""
        sched: Any = scheduler  # private attributes, bench-only
        sched._on_ready = self._wrap(sched._on_ready, lambda *_: self.stamp("notify"))
        replies = sched._replies
        replies.on_reply = self._wrap(replies.on_reply, lambda *_: self.stamp("reply"))
        transport = sched._transport
        for name in ("publish_many", "publish_nowait"):
            original = getattr(transport, name)
            setattr(transport, name, self._wrap(original, self._published))

    def _published(self, messages: Sequence[Any], *_: Any) -> None:
        if any(m.routing_key.endswith(".run.completed") for m in messages):
            self.stamp("published")

    @staticmethod
    def _wrap(original: Callable[..., Any], before: Callable[..., None]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            before(*args)
            return original(*args, **kwargs)

        return wrapped

    # -- report ---------------------------------------------------------------------------

    def table(self) -> str:
        """Median gap between consecutive stages over the runs that have both stamps."""
        lines = ["| from -> to | median ms | runs |", "|---|---|---|"]
        names = dict(STAGES)
        keys = [k for k, _ in STAGES]
        for a, b in itertools.pairwise(keys):
            gaps = [(r[b] - r[a]) * 1000 for r in self._runs if a in r and b in r]
            if gaps:
                lines.append(
                    f"| {names[a]} -> {names[b]} | {statistics.median(gaps):.2f} | {len(gaps)} |"
                )
        total = [(r["observed"] - r["submit"]) * 1000 for r in self._runs if "observed" in r]
        if total:
            lines.append(f"| submit -> observed | {statistics.median(total):.2f} | {len(total)} |")
        return "\n".join(lines)
