"""The CPU the hooks spend on one one-step run, called directly (no I/O, no processes).

    python bench/hook_cost.py [--runs 20000] [--batch 1,10,100]

Calls every event one one-step run causes, through the `HookChain` a role builds
(`role_hooks`: the role's metrics and the `/metrics` server, a hook that hears only `close`):
per step the scheduler's `request_headers`, the agent's `handler_started` and
`handler_finished`; per batch of `--batch` runs a claim, a dispatch, an apply with its
`runs_finished`, and a relay of two events per run. Prints microseconds of CPU per run for
the metrics setting and for `off` (an empty chain), by batch size: what the metrics cost
before any I/O, the figure to compare with the role processes' CPU per run (bench/overhead.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sasflow.commands import FinishedRun
from sasflow.hooks import HookChain, Hooks
from sasflow.messages import Reply, Request
from sasflow.observability import exposition, metrics
from sasflow.states import RunState
from sasflow.store.runs.apply import ApplyReport


class _ServerLike(Hooks):
    """Stands for `MetricsServer` in the chain: it hears `close` only."""

    def close(self) -> None:
        pass


def _request(run_id: int) -> Request:
    return Request(
        step_id=run_id,
        run_id=run_id,
        attempt=1,
        workflow="one",
        step="only",
        agent="noop",
        action="nothing",
        idempotency_key=f"k{run_id}",
        budget_ms=1000,
        complete_by="2026-01-01T00:00:00+00:00",
    )


def cost_per_run(*, metrics_on: bool, runs: int = 20_000, batch: int = 1) -> float:
    """Microseconds of CPU the scheduler's and the agent's hooks spend on one one-step run."""
    if metrics_on:
        scheduler = HookChain([metrics.SchedulerMetrics(exposition.new_registry()), _ServerLike()])
        agent = HookChain([metrics.AgentMetrics(exposition.new_registry()), _ServerLike()])
    else:
        scheduler = agent = HookChain([])
    requests = [_request(i) for i in range(1, batch + 1)]
    replies: list[Any] = [
        (None, Reply(step_id=i, attempt=1, status="ok")) for i in range(1, batch + 1)
    ]
    report = ApplyReport(
        applied=batch,
        finished={i: FinishedRun(RunState.COMPLETED, "one") for i in range(1, batch + 1)},
    )
    headers: dict[str, Any] = {}
    started = time.process_time()
    for _ in range(max(runs // batch, 1)):
        scheduler.steps_claimed(None, requests, 0.001)  # type: ignore[arg-type]
        for request in requests:
            scheduler.request_headers(request)  # type: ignore[arg-type]
        scheduler.steps_dispatched(batch, 0.001)
        for request, (_, reply) in zip(requests, replies, strict=True):
            agent.handler_started(request, headers)
            agent.handler_finished(request, reply, 0.001, None)
        scheduler.runs_finished(None, report.finished)  # type: ignore[arg-type]
        scheduler.replies_applied(replies, report, 0.001)
        scheduler.events_relayed(2 * batch, 0.001)
    done = max(runs // batch, 1) * batch
    return (time.process_time() - started) / done * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--batch", default="1,10,100", help="runs per claim/apply batch")
    args = parser.parse_args()
    for batch in (int(b) for b in args.batch.split(",")):
        off = cost_per_run(metrics_on=False, runs=args.runs, batch=batch)
        on = cost_per_run(metrics_on=True, runs=args.runs, batch=batch)
        print(
            f"batch {batch:>4}: hooks off {off:5.1f} us per run, metrics {on:5.1f} us per run "
            f"(+{on - off:.1f} us)"
        )


if __name__ == "__main__":
    main()
