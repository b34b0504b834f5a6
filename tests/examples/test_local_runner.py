"""LocalRunner, the thread supervisor of the all-in-one process (no I/O: fake roles)."""

from __future__ import annotations

import threading
import time

import pytest

from sasflow.local import LocalRunner, RoleCrashedError


class Idle:
    """Runs until asked to stop, like every real role."""

    def __init__(self) -> None:
        self.stop_event = threading.Event()
        self.ran = threading.Event()

    def run(self) -> None:
        self.ran.set()
        self.stop_event.wait()


class Crashes(Idle):
    def run(self) -> None:
        self.ran.set()
        raise RuntimeError("boom")


class Quits(Idle):
    def run(self) -> None:
        self.ran.set()


class StopsWedged(Idle):
    """An agent wedged past its bound: it sets its own stop event and an exit status."""

    exit_code = 0

    def run(self) -> None:
        self.exit_code = 75
        self.stop_event.set()


class Hangs(Idle):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def run(self) -> None:
        self.release.wait()


def test_roles_run_in_threads_and_all_stop_when_the_runner_exits() -> None:
    roles = [Idle(), Idle(), Idle()]
    runner = LocalRunner()
    for number, role in enumerate(roles):
        runner.add(f"idle-{number}", role)
    with runner.running(stop_timeout=5):
        assert all(role.ran.wait(5) for role in roles)
        assert not any(role.stop_event.is_set() for role in roles)
    assert all(role.stop_event.is_set() for role in roles)
    assert runner.stop(0) == []  # every thread was joined


def test_wait_raises_naming_the_role_that_crashed_and_the_others_are_stopped() -> None:
    idle, crashes = Idle(), Crashes()
    runner = LocalRunner()
    runner.add("idle", idle)
    runner.add("crashes", crashes)
    with (
        pytest.raises(RoleCrashedError, match=r"crashes: RuntimeError\('boom'\)"),
        runner.running(stop_timeout=5),
    ):
        runner.wait(threading.Event(), poll=0.01)
    assert idle.stop_event.is_set()


def test_a_role_that_returns_unasked_has_crashed_but_one_asked_to_stop_has_not() -> None:
    quits, stopped = Quits(), Quits()
    runner = LocalRunner()
    runner.add("quits", quits)
    runner.add("stopped", stopped)
    stopped.stop_event.set()
    runner.start()
    assert quits.ran.wait(5)
    assert stopped.ran.wait(5)
    deadline = time.monotonic() + 5
    while not runner.crashed() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runner.crashed() == ["quits: stopped on its own"]
    assert runner.stop(5) == []


def test_a_role_that_stopped_itself_with_an_exit_status_has_crashed() -> None:
    wedged = StopsWedged()
    runner = LocalRunner()
    runner.add("agent", wedged)
    runner.start()
    deadline = time.monotonic() + 5
    while not runner.crashed() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runner.crashed() == ["agent: stopped with status 75"]
    assert runner.stop(5) == []


def test_wait_returns_when_stop_is_set_and_a_role_that_will_not_stop_is_reported() -> None:
    hangs = Hangs()
    runner = LocalRunner()
    runner.add("hangs", hangs)
    stop = threading.Event()
    stop.set()
    try:
        with (
            pytest.raises(RoleCrashedError, match=r"did not stop within 0s: \['hangs'\]"),
            runner.running(stop_timeout=0.2),
        ):
            runner.wait(stop, poll=0.01)
    finally:
        hangs.release.set()
