"""The doors' reads of the backlog on SQLite (the portable path of ix_runs_backlog): the gate
reuses a read for its window, counts its own admissions meanwhile, and reads again after it."""

from __future__ import annotations

from sqlalchemy import Engine, update

from sasflow import ExternalAgent, Registry, Step, Workflow
from sasflow.commands import NewRun
from sasflow.doors import BacklogGate, room_now
from sasflow.states import RunState
from sasflow.store.db import transaction
from sasflow.store.runs.submit import submit
from sasflow.store.schema import runs

BOUNDED = Workflow("bounded", [Step("s", "a", "act")], max_backlog=3)
REGISTRY = Registry([BOUNDED], [ExternalAgent("a")])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _submit(engine: Engine, *keys: str) -> None:
    with transaction(engine) as conn:
        for key in keys:
            submit(conn, REGISTRY, NewRun("bounded", {}, key=key), namespace="t", actor="test")


def test_the_gate_reuses_a_read_for_its_window_then_reads_again(sqlite_engine: Engine) -> None:
    clock = Clock()
    gate = BacklogGate(10_000, every=1.0, clock=clock)
    _submit(sqlite_engine, "a", "b")
    with transaction(sqlite_engine) as conn:
        assert gate.room(conn, BOUNDED) == room_now(conn, BOUNDED, 10_000)
        assert gate.room(conn, BOUNDED).backlog == 2
    _submit(sqlite_engine, "c")  # another door's run: unseen within the window
    gate.admitted("bounded", 0)
    with transaction(sqlite_engine) as conn:
        assert gate.room(conn, BOUNDED).backlog == 2
    gate.admitted("bounded", 1)  # this door's own admission: counted at once
    with transaction(sqlite_engine) as conn:
        assert gate.room(conn, BOUNDED).full
    with transaction(sqlite_engine) as conn:
        conn.execute(update(runs).values(state=RunState.RUNNING))
    clock.now += 1.0
    with transaction(sqlite_engine) as conn:
        assert gate.room(conn, BOUNDED).backlog == 0


def test_an_unbounded_workflow_is_never_read(sqlite_engine: Engine) -> None:
    gate = BacklogGate(0)
    free = Workflow("free", [Step("s", "a", "act")])
    with transaction(sqlite_engine) as conn:
        room = gate.room(conn, free)
    assert (room.bound, room.full) == (None, False)
