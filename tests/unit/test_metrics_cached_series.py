"""The hooks' cached series and per-batch increments count what the uncached, per-event calls
counted: every new label value still gets its own series, and a batch adds each of its
replies and runs once. And a chain calls only the hooks that override an event."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter

from sasflow.commands import FinishedRun, StepOutcome
from sasflow.hooks import HookChain, Hooks, listeners
from sasflow.messages import Reply, Request
from sasflow.observability.exposition import new_registry
from sasflow.observability.metrics import AgentMetrics, SchedulerMetrics, SubmitterMetrics
from sasflow.observability.series import Series
from sasflow.states import ReplyStatus, RunState
from sasflow.store.runs.apply import ApplyReport


def _request(step: str, agent: str = "pay", workflow: str = "orders") -> Request:
    return Request(
        step_id=1,
        run_id=1,
        attempt=1,
        workflow=workflow,
        step=step,
        agent=agent,
        action="charge",
        idempotency_key="k",
        budget_ms=1000,
        complete_by="2026-01-01T00:00:00+00:00",
    )


def test_a_series_is_made_once_per_label_values_and_a_new_value_gets_its_own() -> None:
    registry = new_registry()
    counter = Counter("things", "Things.", ["kind", "where"], registry=registry)
    series = Series(counter)
    series.of("a", "x").inc()
    series.of("a", "x").inc(2)
    series.of("b", "x").inc(5)
    series.of("a", "y").inc(7)
    assert series.of("a", "x") is series.of("a", "x")
    assert series.of("a", "x") is not series.of("a", "y")
    value = registry.get_sample_value
    assert value("things_total", {"kind": "a", "where": "x"}) == 3
    assert value("things_total", {"kind": "b", "where": "x"}) == 5
    assert value("things_total", {"kind": "a", "where": "y"}) == 7


def test_a_str_enum_and_its_value_share_one_series_labelled_with_the_value() -> None:
    registry = new_registry()
    series = Series(Counter("replies", "Replies.", ["status"], registry=registry))
    series.of(ReplyStatus.OK).inc()
    series.of("ok").inc()
    assert registry.get_sample_value("replies_total", {"status": "ok"}) == 2


def test_applied_replies_are_counted_per_status_per_batch_less_the_dropped() -> None:
    registry = new_registry()
    hooks = HookChain([SchedulerMetrics(registry)])
    replies: list[Any] = [
        (None, Reply(step_id=1, attempt=1, status="ok")),
        (None, Reply(step_id=2, attempt=1, status="ok")),
        (None, Reply(step_id=3, attempt=1, status="failed", error={"type": "E", "message": "m"})),
        (None, Reply(step_id=4, attempt=2, status="ok")),  # dropped: fenced
    ]
    dropped = ApplyReport(applied=3, dropped=[StepOutcome(4, 2, ReplyStatus.OK)])
    hooks.replies_applied(replies, dropped, 0.01)
    later: list[Any] = [(None, Reply(step_id=5, attempt=1, status="deferred", defer_seconds=1))]
    hooks.replies_applied(later, ApplyReport(), 0.01)
    value = registry.get_sample_value
    assert value("sasflow_replies_applied_total", {"status": "ok"}) == 2
    assert value("sasflow_replies_applied_total", {"status": "failed"}) == 1
    assert value("sasflow_replies_applied_total", {"status": "deferred"}) == 1
    assert value("sasflow_replies_applied_total", {"status": "error"}) is None
    assert value("sasflow_replies_dropped_total") == 1
    assert value("sasflow_apply_batch_size_count") == 2
    assert value("sasflow_apply_batch_size_sum") == 5


def test_a_later_batch_of_finished_runs_adds_to_its_series_or_makes_a_new_one() -> None:
    # (one batch's counts: test_metrics_exposition.py)
    registry = new_registry()
    hooks = HookChain([SchedulerMetrics(registry)])
    first = {n: FinishedRun(RunState.COMPLETED, "orders") for n in (1, 2)}
    later = {3: FinishedRun(RunState.COMPLETED, "orders"), 4: FinishedRun(RunState.ERROR, "new")}
    hooks.runs_finished(None, first)  # type: ignore[arg-type]
    hooks.runs_finished(None, later)  # type: ignore[arg-type]
    value = registry.get_sample_value
    finished = "sasflow_runs_finished_total"
    assert value(finished, {"workflow": "orders", "state": "completed"}) == 3
    assert value(finished, {"workflow": "new", "state": "error"}) == 1
    assert value(finished, {"workflow": "new", "state": "completed"}) is None


def test_each_step_and_outcome_of_an_agent_gets_its_own_series() -> None:
    registry = new_registry()
    hooks = HookChain([AgentMetrics(registry)])
    ok = Reply(step_id=1, attempt=1, status="ok")
    hooks.handler_finished(_request("charge"), ok, 0.02, None)
    hooks.handler_finished(_request("charge"), ok, 0.03, None)
    hooks.handler_finished(_request("refund"), None, 2.0, None)
    hooks.handler_finished(_request("charge", agent="bank"), ok, 0.5, None)
    hooks.handler_retrying(_request("charge"), RuntimeError("later"), 1)
    hooks.handler_retrying(_request("charge", agent="bank"), RuntimeError("later"), 1)
    value = registry.get_sample_value
    duration = "sasflow_step_duration_seconds_count"
    assert value(duration, {"workflow": "orders", "step": "charge", "agent": "pay"}) == 2
    assert value(duration, {"workflow": "orders", "step": "refund", "agent": "pay"}) == 1
    assert value(duration, {"workflow": "orders", "step": "charge", "agent": "bank"}) == 1
    outcomes = "sasflow_handler_outcomes_total"
    assert value(outcomes, {"agent": "pay", "status": "ok"}) == 2
    assert value(outcomes, {"agent": "pay", "status": "silent"}) == 1
    assert value(outcomes, {"agent": "bank", "status": "ok"}) == 1
    retries = "sasflow_handler_retries_total"
    assert value(retries, {"agent": "pay", "action": "charge"}) == 1
    assert value(retries, {"agent": "bank", "action": "charge"}) == 1


def test_submissions_are_counted_as_created_and_duplicate() -> None:
    registry = new_registry()
    hooks = HookChain([SubmitterMetrics(registry)])
    hooks.runs_submitted(5, 0)
    hooks.runs_submitted(2, 3)
    value = registry.get_sample_value
    assert value("sasflow_runs_submitted_total", {"result": "created"}) == 7
    assert value("sasflow_runs_submitted_total", {"result": "duplicate"}) == 3


class _ClosesOnly(Hooks):
    def close(self) -> None:
        pass


class _Heard(Hooks):
    def __init__(self) -> None:
        self.heard: list[str] = []

    def dead_lettered(self, queue: str, reason: str) -> None:
        self.heard.append(f"{queue}: {reason}")


class _HeardToo(_Heard):
    pass


def test_a_chain_calls_only_the_hooks_that_override_an_event() -> None:
    quiet, loud, inherited, patched = _ClosesOnly(), _Heard(), _HeardToo(), Hooks()
    calls: list[str] = []
    patched.dead_lettered = lambda queue, reason: calls.append(f"{queue}: {reason}")  # type: ignore[method-assign]
    hooks = [quiet, loud, inherited, patched]
    assert [hook for hook, _ in listeners(hooks, "dead_lettered")] == [loud, inherited, patched]
    assert [hook for hook, _ in listeners(hooks, "close")] == [quiet]
    assert listeners(hooks, "request_headers") == ()
    chain = HookChain(hooks)
    chain.dead_lettered("q", "r")
    assert loud.heard == inherited.heard == calls == ["q: r"]
    assert chain.request_headers(object()) is None  # type: ignore[arg-type]
    assert chain.handler_finished(_request("charge"), None, 0.1, None) is None
