"""How an agent bounds a redelivered exclusive request (sasflow.agents.redelivery): the clocks'
offset learnt from fresh requests, the end it allows, the attempts it took."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sasflow.agents.redelivery import Redeliveries, claimed_at
from sasflow.messages import Request


def _request(claim: float, *, budget_s: float = 4.0, wait_s: float | None = 1.0) -> Request:
    """A request claimed at `claim` (epoch seconds on the database clock)."""
    end = claim + (wait_s or 0.0) + budget_s
    return Request(
        step_id=7,
        run_id=1,
        attempt=2,
        workflow="w",
        step="s",
        agent="a",
        action="x",
        idempotency_key="k",
        budget_ms=int(budget_s * 1000),
        complete_by=datetime.fromtimestamp(end, UTC).isoformat(),
        wait_ms=None if wait_s is None else int(wait_s * 1000),
        exclusive=True,
    )


def test_the_claim_is_the_envelope_less_the_wait_and_the_budget() -> None:
    assert claimed_at(_request(1_000_000.0)) == 1_000_000.0
    assert claimed_at(_request(1_000_000.0, wait_s=None)) is None  # an older scheduler


def test_the_offset_is_the_smallest_receipt_minus_claim_of_fresh_requests() -> None:
    """An agent whose clock is 90 s behind the database's: its receipts are 90 s before the
    claims, plus a transit time; redelivered requests teach nothing."""
    seen = Redeliveries()
    db = 2_000_000.0
    for transit in (0.040, 0.003, 0.700):
        seen.received(_request(db), False, mono=10.0, wall=db - 90 + transit)
    seen.received(_request(db), True, mono=10.0, wall=db - 200)
    offset = seen.offset(10.0)
    assert offset is not None
    assert abs(offset - (-90 + 0.003)) < 1e-6


def test_old_samples_leave_the_window() -> None:
    seen = Redeliveries(window=60)
    seen.received(_request(100.0), False, mono=0.0, wall=100.0)  # offset 0, then forgotten
    seen.received(_request(100.0), False, mono=50.0, wall=105.0)
    assert seen.offset(50.0) == 0.0
    assert seen.offset(70.0) == 5.0
    assert seen.offset(200.0) is None


def test_a_redelivered_request_ends_at_its_claim_plus_its_budget_on_this_clock() -> None:
    """Skewed 90 s behind, the agent received a fresh request 5 ms after its claim; a request
    claimed 3 s ago (budget 4 s) redelivered now may run about 1 s more."""
    seen = Redeliveries()
    db = 3_000_000.0
    seen.received(_request(db), False, mono=100.0, wall=db - 90 + 0.005)
    now_db = db + 50
    latest = seen.latest_end(_request(now_db - 3), mono=150.0, wall=now_db - 90 + 0.005)
    assert latest is not None
    assert abs(latest - (150.0 + 1.0)) < 0.01
    assert seen.latest_end(_request(now_db, wait_s=None), mono=150.0, wall=now_db) is None


def test_without_a_fresh_request_the_clocks_are_taken_to_agree() -> None:
    seen = Redeliveries()
    latest = seen.latest_end(_request(1_000.0), mono=7.0, wall=1_010.0)
    assert latest == 7.0 + (1_000.0 + 4.0 - 1_010.0)


def test_an_exclusive_attempt_taken_here_is_remembered_then_forgotten() -> None:
    seen = Redeliveries(kept=0.05, most=2)
    request = _request(1.0)
    assert not seen.taken(request)
    seen.took(request, time.monotonic())
    assert seen.taken(request)
    time.sleep(0.1)
    assert not seen.taken(request)
    for attempt in (1, 2, 3):  # at most 2 remembered: the oldest goes
        seen.took(request.model_copy(update={"attempt": attempt}), time.monotonic() + 60)
    assert not seen.taken(request.model_copy(update={"attempt": 1}))
    assert seen.taken(request.model_copy(update={"attempt": 3}))
