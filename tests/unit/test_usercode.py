"""The user-code pool (scheduler.usercode): builders run on its threads, and what one raises,
returns that is not JSON, or how long it overruns becomes its step's (or run's) error."""

from __future__ import annotations

import threading
import time
from typing import Any

from sasflow import Step, StepContext, Workflow
from sasflow.commands import StoredError
from sasflow.scheduler.usercode import OUTPUT, Job, UserCode, UserCodeOptions
from sasflow.store.runs.decide import BuildFailed

CTX = StepContext(run_input={"n": 1}, outputs={"a": {"x": 2}}, run_id=7, business_key="k")
release = threading.Event()


def _explode(ctx: StepContext) -> Any:
    raise ValueError("bad input")


def _not_json(ctx: StepContext) -> Any:
    return {"when": object()}


def _stuck(ctx: StepContext) -> Any:
    release.wait(10)
    return "late"


def _summed(ctx: StepContext) -> Any:
    return ctx.outputs["a"]["x"] + ctx.run_input["n"]


WORKFLOW = Workflow(
    "w",
    [
        Step("a", "svc", "go"),
        Step("boom", "svc", "go", after=("a",), input=_explode),
        Step("odd", "svc", "go", after=("a",), input=_not_json),
        Step("stuck", "svc", "go", after=("a",), input=_stuck),
        Step("sum", "svc", "go", after=("a",), input=_summed),
    ],
    output=_explode,
)


def _settle(job: Job, budget: float) -> Any:
    deadline = time.monotonic() + 10
    while (result := job.result(time.monotonic(), budget)) is None:
        assert time.monotonic() < deadline, "the job neither ended nor overran"
        time.sleep(0.01)
    return result


def test_builders_run_on_the_pool_and_their_failures_name_the_step() -> None:
    ended = threading.Event()
    pool = UserCode(UserCodeOptions(threads=2, budget_s=5.0), ended.set)
    try:
        jobs = {key: pool.submit(WORKFLOW, 7, key, CTX) for key in ("sum", "boom", "odd", OUTPUT)}
        results = {key: _settle(job, 5.0) for key, job in jobs.items()}
    finally:
        pool.close()
    assert ended.is_set()
    assert results["sum"] == 3
    assert results["boom"] == BuildFailed(
        StoredError("InvalidInputError", "step 'boom': input builder raised ValueError: bad input")
    )
    odd = results["odd"]
    assert isinstance(odd, BuildFailed)
    assert odd.error.message.startswith("step 'odd': input is not JSON")
    assert results[OUTPUT] == BuildFailed(
        StoredError("InvalidOutputError", "run output builder raised ValueError: bad input")
    )


def test_a_builder_past_its_budget_fails_and_the_pool_goes_on() -> None:
    """The overrun is reported at the budget's end, not when the builder returns; the pool's
    other thread keeps building."""
    pool = UserCode(UserCodeOptions(threads=2, budget_s=0.2), lambda: None)
    try:
        stuck = pool.submit(WORKFLOW, 7, "stuck", CTX)
        result = _settle(stuck, 0.2)
        assert result == BuildFailed(
            StoredError(
                "BuilderTimeoutError",
                "step 'stuck': input builder exceeded its time budget of 0.2s",
            )
        )
        assert _settle(pool.submit(WORKFLOW, 8, "sum", CTX), 0.2) == 3
    finally:
        release.set()
        pool.close()
