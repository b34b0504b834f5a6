"""The scheduler loop's duties (engine/scheduler/duty.py, claims.py, outbox.py): when each is
due and how long each lets the loop sleep, with fakes for what they drive."""

from __future__ import annotations

import threading
from typing import cast

import pytest

from sasflow.relay import HELD_BACK_RETRY, Relay
from sasflow.scheduler.claims import ClaimDuty, ClusterDuty
from sasflow.scheduler.cluster.member import ClusterMember
from sasflow.scheduler.dispatch import Claimed, Dispatcher
from sasflow.scheduler.duty import INF, Periodic
from sasflow.scheduler.outbox import CONFIRM_POLL, RELAY_BATCH, RelayDuty


class FakeMember:
    def __init__(self, *, may_act: bool = True, step: float = 0.5) -> None:
        self.may_act = may_act
        self.seconds = step

    def step(self) -> float:
        return self.seconds


class FakeDispatcher:
    def __init__(
        self,
        full: bool = False,
        due: float | None = None,
        flow_due: float | None = None,
        flow_full: bool = False,
    ) -> None:
        self.answer = Claimed(full=full, due=due, flow_full=flow_full, flow_due=flow_due)
        self.claims = 0
        self.calls: list[tuple[bool, bool]] = []

    def claim_and_dispatch(self, *, plain: bool = True, budgeted: bool = True) -> Claimed:
        self.claims += 1
        self.calls.append((plain, budgeted))
        return self.answer


class FakeRelay:
    def __init__(self, relayed: int = 0) -> None:
        self.relayed = relayed
        self.in_flight = False
        self.held_back = False
        self.starts = self.polls = 0

    def start(self) -> int:
        self.starts += 1
        return self.relayed

    def poll(self) -> None:
        self.polls += 1


def _claim_duty(member: FakeMember, dispatcher: FakeDispatcher, wake: threading.Event) -> ClaimDuty:
    return ClaimDuty(
        cast(ClusterMember, member), cast(Dispatcher, dispatcher), wake, rescan_interval=1.0
    )


def test_periodic_runs_at_its_interval_from_the_pass_that_ran_it() -> None:
    calls: list[float] = []
    duty = Periodic(2.0, lambda: calls.append(1.0))
    assert duty.run(10.0) == INF
    assert duty.run(11.9) == INF
    assert (len(calls), duty.due) == (1, 12.0)
    duty.run(12.0)
    assert (len(calls), duty.due) == (2, 14.0)
    duty.reset()
    duty.run(12.5)
    assert len(calls) == 3


def test_the_cluster_duty_is_due_when_the_membership_step_says() -> None:
    duty = ClusterDuty(cast(ClusterMember, FakeMember(step=0.25)))
    assert duty.run(100.0) == INF
    assert duty.due == 100.25


def test_a_claim_is_made_at_the_rescan_interval_or_when_woken() -> None:
    dispatcher, wake = FakeDispatcher(), threading.Event()
    duty = _claim_duty(FakeMember(), dispatcher, wake)
    assert duty.run(5.0) == INF  # due at once after a reset
    assert (dispatcher.claims, duty.due) == (1, 6.0)
    duty.run(5.5)
    assert dispatcher.claims == 1
    wake.set()
    duty.run(5.6)
    assert (dispatcher.claims, duty.due, wake.is_set()) == (2, 6.6, False)


def test_a_full_batch_claims_again_without_sleeping() -> None:
    dispatcher, wake = FakeDispatcher(full=True), threading.Event()
    duty = _claim_duty(FakeMember(), dispatcher, wake)
    assert duty.run(5.0) == 0.0
    assert duty.run(5.0) == 0.0
    assert dispatcher.calls == [(True, True), (True, False)]  # again: the full claim alone


def test_a_backoff_ending_before_the_rescan_brings_the_claim_forward() -> None:
    duty = _claim_duty(FakeMember(), FakeDispatcher(due=0.0), threading.Event())
    duty.run(1e9)  # far past this process's monotonic clock: the backoff ends sooner
    assert duty.due < 1e9


def test_a_budgeted_claim_due_first_runs_alone_and_the_plain_claim_keeps_its_rescan() -> None:
    """A rate's next call (the budgeted claim's due) comes before the rescan: at that time only
    the budgeted claim runs; the plain claim runs again at its rescan or when woken."""
    dispatcher, wake = FakeDispatcher(flow_due=0.0), threading.Event()
    duty = _claim_duty(FakeMember(), dispatcher, wake)
    duty.run(1e9)  # far past this process's monotonic clock: the budgeted claim is due first
    assert dispatcher.calls == [(True, True)]
    assert duty.due < 1e9
    duty.run(1e9 + 0.1)
    assert dispatcher.calls[-1] == (False, True)
    wake.set()
    duty.run(1e9 + 0.2)
    assert dispatcher.calls[-1] == (True, True)


def test_no_claim_without_a_lease() -> None:
    dispatcher, wake = FakeDispatcher(), threading.Event()
    wake.set()
    duty = _claim_duty(FakeMember(may_act=False), dispatcher, wake)
    assert duty.run(5.0) == INF
    assert (dispatcher.claims, wake.is_set()) == (0, True)


def test_the_relay_runs_at_once_then_at_its_interval_or_when_events_were_recorded() -> None:
    relay = FakeRelay()
    duty = RelayDuty(cast(Relay, relay), interval=1.0)
    duty.run(5.0)
    assert (relay.starts, duty.due) == (1, 6.0)
    duty.run(5.5)
    assert relay.starts == 1
    duty.recorded()
    duty.run(5.6)
    assert (relay.starts, duty.due) == (2, 6.6)


def test_a_full_relay_batch_relays_again_at_the_next_pass() -> None:
    relay = FakeRelay(relayed=RELAY_BATCH)
    duty = RelayDuty(cast(Relay, relay), interval=1.0)
    duty.run(5.0)
    duty.run(5.1)
    assert relay.starts == 2


def test_a_claim_brings_the_relay_forward_and_confirms_awaited_bound_the_sleep() -> None:
    relay = FakeRelay()
    duty = RelayDuty(cast(Relay, relay), interval=1e9)
    duty.run(0.0)
    duty.claimed()
    duty.run(1.0)
    assert duty.due < 1e9  # within CLAIM_EVENTS_DELAY of this process's monotonic clock
    relay.in_flight = True
    assert duty.run(1.0) == CONFIRM_POLL
    assert relay.polls == 1


def test_a_pass_that_held_events_back_is_followed_soon_by_another_with_a_backoff() -> None:
    """Events held back (another relay held their run's earlier one) are taken again within
    milliseconds, then with a doubling delay while passes keep holding back, and at the
    interval again once one did not."""
    relay = FakeRelay()
    duty = RelayDuty(cast(Relay, relay), interval=60.0)
    relay.held_back = True
    duty.run(10.0)
    assert duty.due == pytest.approx(10.0 + HELD_BACK_RETRY)
    duty.run(duty.due)
    assert duty.due == pytest.approx(10.0 + 3 * HELD_BACK_RETRY)  # then twice as long
    relay.held_back = False
    duty.run(duty.due)
    assert relay.starts == 3
    assert duty.due == pytest.approx(10.0 + 3 * HELD_BACK_RETRY + 60.0)


def test_a_batch_marked_after_holding_events_back_brings_the_next_pass_forward() -> None:
    """A batch in flight held events back; once it is marked (at a poll), they can be taken:
    the next pass comes within milliseconds, not at the interval."""
    relay = FakeRelay()
    duty = RelayDuty(cast(Relay, relay), interval=60.0)
    duty.run(10.0)
    relay.in_flight = True
    relay.held_back = True  # the poll marked that batch
    duty.run(11.0)
    assert (relay.starts, relay.polls) == (1, 1)
    assert duty.due == pytest.approx(11.0 + HELD_BACK_RETRY)
