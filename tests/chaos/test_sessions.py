"""The agent-side observation of the chaos run's concurrency limit: the service's sessions,
their leases, the overlap check, and the handler that opens and closes them."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sasflow.agents import Call, TransientError
from tests.chaos.concurrency import judge
from tests.chaos.remote import RemoteService
from tests.chaos.session_call import REMOTE_URL, GaveUpError, charge_in_session
from tests.chaos.sessions import (
    RefusedError,
    Session,
    SessionLedger,
    account_for,
    max_concurrent,
    overlaps,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _session(
    begin: float, end: float | None, *, account: str = "a", step: int = 1, attempt: int = 1
) -> Session:
    return Session(
        id=f"{step}-{attempt}-{begin}",
        account=account,
        step_id=step,
        attempt=attempt,
        pid=7,
        budget=4.0,
        begin=begin,
        closed_at=end,
    )


def _open(ledger: SessionLedger, session: str, **fields: Any) -> None:
    request = {"session": session, "account": "a", "step_id": 1, "attempt": 1, "pid": 7}
    ledger.open({**request, "budget": 4.0, **fields})


def test_touching_sessions_pass_and_overlapping_ones_are_found() -> None:
    touching = [_session(0, 1, step=1), _session(1, 2, step=2), _session(2, None, step=3)]
    assert overlaps(touching) == []
    assert max_concurrent(touching) == {"a": 1}
    assert judge(touching).holds

    crossing = [_session(0, 1.5, step=1), _session(1, 2, step=2), _session(5, 6, account="b")]
    found = overlaps(crossing)
    assert [(o.first.step_id, o.second.step_id) for o in found] == [(1, 2)]
    assert found[0].seconds == pytest.approx(0.5)
    assert max_concurrent(crossing) == {"a": 2, "b": 1}
    assert not judge(crossing).holds


def test_a_session_never_closed_lasts_its_lease_and_one_inside_another_overlaps() -> None:
    # begin 0, never closed: until 0 + 4 s. The later, shorter one lies inside it.
    sessions = [_session(0, None, step=1), _session(2.5, 2.6, step=1, attempt=2)]
    verdict = judge(sessions)
    assert len(verdict.between) == 1
    assert verdict.within == []
    # A long session and several short ones after it: each short one is found.
    many = [_session(0, 10, step=1), *(_session(t, t + 0.5, step=t + 2) for t in (1, 3, 5))]
    assert len(overlaps(many)) == 3


def test_two_executions_of_one_attempt_are_reported_apart() -> None:
    redelivered = [_session(0, None, step=1), _session(1, 2, step=1)]
    verdict = judge(redelivered)
    assert verdict.between == []
    assert len(verdict.within) == 1
    assert not verdict.holds


def test_an_effect_past_the_lease_is_refused_and_counted() -> None:
    clock = Clock()
    ledger = SessionLedger(clock=clock)
    _open(ledger, "s1")
    clock.now += 3.9
    assert ledger.close("s1", lambda: {"effect": 1}) == {"effect": 1}
    _open(ledger, "s2", step_id=2)
    clock.now += 4.01
    applied: list[int] = []

    def effect() -> dict[str, Any]:
        applied.append(2)
        return {"effect": 2}

    with pytest.raises(RefusedError, match="lease ended"):
        ledger.close("s2", effect)
    with pytest.raises(RefusedError):
        ledger.close("s2", effect)
    sessions, late = ledger.snapshot()
    assert applied == []
    assert late == 1
    by_id = {s.id: s for s in sessions}
    assert by_id["s1"].end == pytest.approx(103.9)
    assert by_id["s2"].refused
    assert by_id["s2"].end == pytest.approx(by_id["s2"].begin + 4.0)


def test_no_session_without_budget_a_reopen_supersedes_and_a_release_closes() -> None:
    clock = Clock()
    ledger = SessionLedger(clock=clock)
    with pytest.raises(RefusedError, match="no budget"):
        _open(ledger, "s0", budget=0.0)
    _open(ledger, "s1")
    clock.now += 1
    _open(ledger, "s2")  # the handler retried within the same call: s1 ends now
    clock.now += 1
    ledger.release("s2")
    sessions, _ = ledger.snapshot()
    assert [(s.id, s.begin, s.end) for s in sessions] == [("s1", 100, 101), ("s2", 101, 102)]
    assert judge(sessions).holds


def test_accounts_are_few_and_a_function_of_the_key() -> None:
    accounts = {account_for(f"s1-{i}") for i in range(300)}
    assert 5 <= len(accounts) <= 8
    assert account_for("s1-17") == account_for("s1-17")


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch) -> Iterator[RemoteService]:
    service = RemoteService()
    service.start()
    monkeypatch.setenv(REMOTE_URL, service.url)
    yield service
    service.stop()


def _call(seconds: float, work: float, step_id: int = 5) -> Call:
    return Call(
        input={"work": work, "account": "acct-1"},
        idempotency_key=f"key-{step_id}",
        attempt=1,
        deadline=time.monotonic() + seconds,
        step_id=step_id,
        run_id=1,
        workflow="chaos_order",
        step="charge",
        action="charge",
        kind="forward",
    )


def test_the_handler_works_inside_its_session(remote: RemoteService) -> None:
    output = charge_in_session(_call(4.0, 0.05))
    sessions, late = remote.sessions.snapshot()
    calls, effects = remote.ledger.snapshot()
    assert output["effect"] == effects["key-5"]["effect"]
    assert late == 0
    [session] = sessions
    assert (session.account, session.step_id, session.pid) == ("acct-1", 5, os.getpid())
    assert 3.5 < session.budget <= 4.0
    assert session.closed_at is not None
    assert session.closed_at - session.begin >= 0.05
    assert [c.key for c in calls] == ["key-5"]


def test_the_handler_gives_up_silently_past_its_deadline(remote: RemoteService) -> None:
    with pytest.raises(GaveUpError, match="past the deadline"):
        charge_in_session(_call(0.1, 0.2))
    sessions, _ = remote.sessions.snapshot()
    assert [s.closed_at is None for s in sessions] == [True]  # the lease ended first
    assert remote.ledger.snapshot()[1] == {}  # no effect
    with pytest.raises(GaveUpError):
        charge_in_session(_call(0.0, 0.0, step_id=6))  # no session at all
    assert len(remote.sessions.snapshot()[0]) == 1


def test_an_effect_the_service_refuses_is_given_up(remote: RemoteService) -> None:
    """A frozen agent: its own check passed, the lease ended before the call arrived."""
    call = _call(4.0, 0.0)
    gate = threading.Event()
    real_close = remote.sessions.close

    def late_close(session_id: str, effect: Any) -> dict[str, Any]:
        remote.sessions.clock = lambda: time.monotonic() + 10  # the lease is over
        gate.set()
        return real_close(session_id, effect)

    remote.sessions.close = late_close  # type: ignore[method-assign]
    with pytest.raises(GaveUpError, match="refused") as raised:
        charge_in_session(call)
    assert gate.is_set()
    assert isinstance(raised.value, TransientError)
    assert remote.sessions.snapshot()[1] == 1
    assert remote.ledger.snapshot()[1] == {}
