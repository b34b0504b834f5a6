"""The chaos run's concurrency limit, and its invariant: one `charge` at a time per account.

`define_limit` sets the flow limit through the operator's CLI (`sasflow limits set`, audited
like any operator change) before the fleet starts. `check` judges it twice:

- **from the agent side** (the invariant): the sessions the handlers opened at the remote
  service (tests/chaos/sessions.py), intervals on the service's clock. No two sessions of one
  account may overlap, whether of two steps or of two attempts of one step. Two executions of
  one attempt (a request redelivered after its agent was killed, the killed agent's session
  left open to its lease's end) are reported apart, and judged too.
- **from the database**: each attempt's `processing` interval from the step events (claimed:
  `pending -> processing`; left: the next event out of `processing`), per account. Event times
  are their transaction's start (`now()`), earlier than the change they record by the length
  of that transaction, so two intervals of one account may seem to overlap by a transaction's
  length (a claim transaction that waited for the limit's lock while the previous step's reply
  was committed): reported, with the longest, not judged.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine, select

from sasflow.store.schema import events, runs, steps
from tests.chaos.sessions import (
    LIMIT_KEY,
    LIMIT_NAME,
    LIMITED_ACTION,
    LIMITED_AGENT,
    Session,
    max_concurrent,
    overlaps,
    same_execution_kinds,
)

SASFLOW = (sys.executable, "-m", "sasflow")


def define_limit(env: dict[str, str], cwd: Path, concurrency: int | None) -> str:
    """`sasflow limits set` the per-account limit (None: `sasflow limits delete` it, for a
    cluster's database that a run before this one left it in); the CLI's answer."""
    if concurrency is None:
        gone = subprocess.run(
            [*SASFLOW, "limits", "delete", LIMIT_NAME, "--reason", "chaos run without it"],
            env=env,
            cwd=cwd,
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        left = f" ({gone.stdout.strip()})" if gone.returncode == 0 else ""
        return f"no limit on {LIMITED_AGENT}/{LIMITED_ACTION}{left}"
    done = subprocess.run(
        [
            *SASFLOW,
            "limits",
            "set",
            LIMIT_NAME,
            "--agent",
            LIMITED_AGENT,
            "--action",
            LIMITED_ACTION,
            "--key",
            LIMIT_KEY,
            "--concurrency",
            str(concurrency),
            "--reason",
            "chaos suite: one charge at a time per account",
            "--by",
            "chaos",
        ],
        env=env,
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout.strip()


@dataclass(frozen=True)
class Interval:
    step_id: int
    attempt: int
    begin: datetime
    end: datetime | None
    """None: still processing when the history was read."""


def processing_intervals(engine: Engine) -> dict[str, list[Interval]]:
    """Per account, the `processing` intervals of the limited steps, from their events."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                events.c.step_id,
                events.c.from_state,
                events.c.to_state,
                events.c.attempt,
                events.c.created_at,
                runs.c.input,
            )
            .join(steps, steps.c.id == events.c.step_id)
            .join(runs, runs.c.id == steps.c.run_id)
            .where(
                events.c.entity == "step",
                steps.c.agent == LIMITED_AGENT,
                steps.c.action == LIMITED_ACTION,
            )
            .order_by(events.c.step_id, events.c.id)
        ).all()
    found: dict[str, list[Interval]] = defaultdict(list)
    opened: dict[int, tuple[int, datetime]] = {}
    for row in rows:
        account = str((row.input or {}).get("account", ""))
        if row.to_state == "processing" and row.from_state != "processing":
            opened[row.step_id] = (row.attempt or 0, row.created_at)
        elif row.from_state == "processing" and row.to_state != "processing":
            attempt, begin = opened.pop(row.step_id, (row.attempt or 0, row.created_at))
            found[account].append(Interval(row.step_id, attempt, begin, row.created_at))
    for step_id, (attempt, begin) in opened.items():
        account = next(
            (str((r.input or {}).get("account", "")) for r in rows if r.step_id == step_id), ""
        )
        found[account].append(Interval(step_id, attempt, begin, None))
    return found


def history_overlaps(intervals: dict[str, list[Interval]]) -> list[float]:
    """Seconds of each overlap of two intervals of one account (an open one never ends)."""
    seconds = []
    for unordered in intervals.values():
        group = sorted(unordered, key=lambda i: (i.begin, i.step_id))
        for n, first in enumerate(group):
            for second in group[n + 1 :]:
                if first.end is not None and second.begin >= first.end:
                    break
                ends = [e for e in (first.end, second.end) if e is not None]
                end = min(ends) if ends else second.begin
                seconds.append((end - second.begin).total_seconds())
    return seconds


@dataclass(frozen=True)
class Verdict:
    """What `judge` found in the sessions (the figures the report prints)."""

    sessions: int
    accounts: int
    most_at_once: dict[str, int]
    between: list[str]
    """Overlaps of two steps, or two attempts of one step."""
    within: list[str]
    """Overlaps of two executions of one attempt (a redelivered request)."""
    pairs: list[tuple[Session, Session]]
    """The overlapping sessions, steps or attempts first."""

    @property
    def holds(self) -> bool:
        return not self.between and not self.within


def judge(sessions: list[Session]) -> Verdict:
    between, within = same_execution_kinds(overlaps(sessions))
    most = max_concurrent(sessions)
    return Verdict(
        sessions=len(sessions),
        accounts=len(most),
        most_at_once=dict(sorted(most.items())),
        between=[o.describe() for o in between],
        within=[o.describe() for o in within],
        pairs=[(o.first, o.second) for o in [*between, *within]],
    )


def explain(engine: Engine, pairs: list[tuple[Session, Session]]) -> list[str]:
    """For each overlapping pair (at most 3): both sessions (begin, end, closed or ran to its
    lease) and both steps' histories, so a report says how the overlap came about."""
    lines: list[str] = []
    for first, second in pairs[:3]:
        base = min(first.begin, second.begin)
        for s in (first, second):
            how = "lease ran out" if s.closed_at is None else "closed"
            lines.append(
                f"    session {s.step_id}#{s.attempt} pid {s.pid}: +{s.begin - base:.3f}s to "
                f"+{s.end - base:.3f}s ({how}; budget {s.budget:.3f}s"
                + (", effect refused" if s.refused else "")
                + ")"
            )
        ids = sorted({first.step_id, second.step_id})
        with engine.connect() as conn:
            rows = conn.execute(
                select(
                    events.c.step_id,
                    events.c.from_state,
                    events.c.to_state,
                    events.c.attempt,
                    events.c.actor,
                    events.c.reason,
                    events.c.created_at,
                )
                .where(events.c.entity == "step", events.c.step_id.in_(ids))
                .order_by(events.c.id)
            ).all()
        lines.extend(
            f"    step {row.step_id}#{row.attempt} {row.created_at:%H:%M:%S.%f} "
            f"{row.from_state}->{row.to_state} by {row.actor}: {(row.reason or '')[:120]}"
            for row in rows
        )
    return lines
