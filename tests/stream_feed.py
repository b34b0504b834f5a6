"""Feeding the subscription stream in tests: submit runs and relay their events, as a
submitter and a scheduler would, with no agent (so each run has one event: `pending`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy import update

from sasflow import Registry, submit_run
from sasflow.relay import relay_events
from sasflow.store.db import Engine, transaction
from sasflow.store.schema import runs
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.topology import Names, declare_common
from tests.apps.basic import diamond, echo, pipeline

REGISTRY = Registry(workflows=[pipeline, diamond], agents=[echo])


class Feed:
    """Submits runs of `pipeline` or `diamond` and relays their events (the status messages
    go to an in-process bus nobody reads)."""

    def __init__(self, engine: Engine, names: Names, bus: MemoryTransport) -> None:
        self.engine, self.names, self.bus = engine, names, bus

    def runs(
        self, count: int, workflow: str = "pipeline", *, submitted_by: str | None = None
    ) -> list[int]:
        """Submit `count` runs in one transaction, relay every event; returns the run ids."""
        with transaction(self.engine) as conn:
            ids = [
                submit_run(
                    conn, REGISTRY, workflow, {"text": "x"}, namespace=self.names.namespace
                ).run_id
                for _ in range(count)
            ]
            if submitted_by is not None:
                conn.execute(
                    update(runs).where(runs.c.id.in_(ids)).values(submitted_by=submitted_by)
                )
        self.relay()
        return ids

    def relay(self) -> None:
        while relay_events(self.engine, self.bus, self.names):
            pass


@contextlib.contextmanager
def feeding(engine: Engine, names: Names) -> Iterator[Feed]:
    bus = MemoryTransport(MemoryBroker(), process_name="test-stream-feed")
    bus.connect()
    try:
        declare_common(bus, names)
        yield Feed(engine, names, bus)
    finally:
        bus.close()
