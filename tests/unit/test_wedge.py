"""When an agent process counts itself wedged, free again, or due to exit (agents.wedge), and
how hand-backs are bounded (agents.handback)."""

from __future__ import annotations

import time

from sasflow.agents.agent import Call
from sasflow.agents.handback import DEFER_MOST_S, HANDBACK_LIMIT, HandBacks
from sasflow.agents.jobs import Job
from sasflow.agents.wedge import Change, WedgeOptions, WedgeWatch
from sasflow.messages import Request
from sasflow.ops.agents import status_text
from sasflow.transport.base import Delivery


def _job(step_id: int, *, late_s: float) -> Job:
    """A job whose deadline passed `late_s` seconds ago, taken by a worker thread."""
    request = Request(
        step_id=step_id,
        run_id=1,
        attempt=1,
        workflow="w",
        step="s",
        agent="a",
        action="x",
        input=None,
        idempotency_key="k",
        budget_ms=1000,
        complete_by="2026-11-25T10:00:00+00:00",
    )
    call = Call(
        input=None,
        idempotency_key="k",
        attempt=1,
        deadline=time.monotonic() - late_s,
        step_id=step_id,
        run_id=1,
        workflow="w",
        step="s",
        action="x",
        kind="forward",
    )
    job = Job(Delivery(tag=step_id, body=b"", queue="q", generation=1), request, call)
    job.taken = True
    return job


def test_wedged_only_when_every_thread_is_held_past_deadline_and_grace() -> None:
    watch = WedgeWatch(2, WedgeOptions(grace=5.0, exit_after=0))
    held, within_grace = _job(1, late_s=6), _job(2, late_s=1)
    watch.abandoned(held)
    watch.abandoned(within_grace)
    assert (watch.check(), watch.held, watch.wedged) == (Change.NONE, 1, False)
    also_held = _job(3, late_s=6)
    watch.abandoned(also_held)
    assert (watch.check(), watch.held, watch.wedged) == (Change.WEDGED, 2, True)
    assert watch.check() is Change.NONE  # said once
    watch.returned(held)
    watch.returned(within_grace)
    assert (watch.check(), watch.held, watch.wedged) == (Change.FREED, 1, False)


def test_wedged_past_the_bound_it_exits_and_never_with_a_zero_bound() -> None:
    bounded = WedgeWatch(1, WedgeOptions(grace=0, exit_after=60))
    never = WedgeWatch(1, WedgeOptions(grace=0, exit_after=0))
    for watch in (bounded, never):
        watch.abandoned(_job(1, late_s=1))
        assert watch.check() is Change.WEDGED
        assert watch.wedged_since is not None
    assert bounded.check() is Change.NONE
    assert bounded.next_due() == (bounded.wedged_since or 0) + 60
    for watch in (bounded, never):  # wedged for 61 s
        watch.wedged_since = (watch.wedged_since or 0) - 61
    assert (bounded.check(), never.check()) == (Change.EXIT, Change.NONE)


def test_a_job_no_thread_took_never_counts_as_held() -> None:
    watch = WedgeWatch(1, WedgeOptions(grace=0, exit_after=0))
    waiting = _job(1, late_s=10)
    waiting.taken = False
    watch.abandoned(waiting)
    assert (watch.check(), watch.held) == (Change.NONE, 0)


def test_an_attempt_is_requeued_a_bounded_number_of_times_then_deferred_longer_each_time() -> None:
    backs = HandBacks()
    assert [backs.requeue_again(7, 1) for _ in range(HANDBACK_LIMIT + 1)] == [True] * (
        HANDBACK_LIMIT
    ) + [False]
    assert backs.requeue_again(7, 2), "a new attempt is counted afresh"
    delays = [backs.defer_seconds(7) for _ in range(8)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, DEFER_MOST_S, DEFER_MOST_S]


def test_a_job_is_either_taken_by_a_worker_or_given_back_never_both() -> None:
    backs = HandBacks()
    given, taken = _job(1, late_s=0), _job(2, late_s=0)
    given.taken = taken.taken = False
    assert backs.give_back(given)
    assert not backs.take(given)
    assert backs.take(taken)
    assert not backs.give_back(taken)


def test_operators_read_a_wedged_instance_as_wedged_with_its_held_threads() -> None:
    def shown(state: str, held: int, concurrency: int = 2) -> str:
        instance = {"state": state, "held": held, "concurrency": concurrency}
        instance["wedged"] = state == "live" and held >= concurrency
        return status_text(instance)

    assert shown("live", 2) == "wedged, 2 held past deadline"
    assert shown("live", 1) == "live, 1 held past deadline"
    assert shown("live", 0) == "live"
    assert shown("lost", 2) == "lost"
