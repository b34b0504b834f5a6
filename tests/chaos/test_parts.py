"""The chaos harness's pure parts: the seeded schedule, crash-loop detection, the remote
service's deduplication and the poison catalogue."""

from __future__ import annotations

import json

import pytest

from sasflow.transport.topology import Names
from tests.chaos.faults import ALL_FAULTS, PROCESS_FAULTS, plan
from tests.chaos.fleet import CRASH_LOOP_EXITS, CRASH_LOOP_WINDOW, Exit, Slot
from tests.chaos.remote import Ledger
from tests.chaos.workload import NO_STEP, poison_messages

SLOTS = {
    "agent": ["alpha-1", "beta-1"],
    "scheduler": ["scheduler-1", "scheduler-2"],
    "supervisor": ["supervisor-1"],
    "submitter": ["submitter"],
}


def test_the_schedule_is_a_function_of_the_seed_and_covers_every_fault_type() -> None:
    first, again, other = plan(7, 100, SLOTS), plan(7, 100, SLOTS), plan(8, 100, SLOTS)
    assert first == again
    assert first != other
    assert {f.kind for f in first} == set(ALL_FAULTS)
    assert all(0 < f.at < 100 for f in first)
    assert [f.at for f in first] == sorted(f.at for f in first)


def test_process_faults_target_a_slot_of_their_role() -> None:
    for fault in plan(3, 300, SLOTS):
        if fault.kind in PROCESS_FAULTS:
            assert fault.target in SLOTS[fault.kind.split("_", 1)[1]]


def test_unexpected_exits_close_together_are_a_crash_loop() -> None:
    spread = [Exit(i * CRASH_LOOP_WINDOW, 1, expected=False) for i in range(CRASH_LOOP_EXITS)]
    close = [Exit(float(i), 1, expected=False) for i in range(CRASH_LOOP_EXITS)]
    killed = [Exit(float(i), -9, expected=True) for i in range(CRASH_LOOP_EXITS * 2)]
    assert not Slot("a", [], exits=spread).crash_looping()
    assert Slot("a", [], exits=close).crash_looping()
    assert not Slot("a", [], exits=killed).crash_looping()


def test_the_remote_service_applies_a_key_once_and_records_every_call() -> None:
    ledger = Ledger()
    request = {"key": "k", "step_id": 1, "run_id": 1, "step": "s", "attempt": 1, "pid": 1}
    first = ledger.apply(request)
    second = ledger.apply({**request, "attempt": 2})
    other = ledger.apply({**request, "key": "j", "step_id": 2})
    calls, effects = ledger.snapshot()
    assert first == second
    assert other["effect"] != first["effect"]
    assert [(c.key, c.attempt, c.deduplicated) for c in calls] == [
        ("k", 1, False),
        ("k", 2, True),
        ("j", 1, False),
    ]
    assert set(effects) == {"k", "j"}


@pytest.mark.parametrize("agents", [["alpha", "beta"]])
def test_poison_covers_every_queue_and_never_names_a_live_step(agents: list[str]) -> None:
    names = Names("ns")
    items = poison_messages(names, agents, "t")
    queues = {p.queue for p, _ in items}
    assert queues == {names.submit, names.replies, *(names.agent(a) for a in agents)}
    assert len({p.id for p, _ in items}) == len(items)
    for poison, body in items:
        try:
            decoded = json.loads(body)
        except ValueError:
            continue
        if isinstance(decoded, dict) and isinstance(decoded.get("step_id"), int):
            assert decoded["step_id"] == NO_STEP, poison
