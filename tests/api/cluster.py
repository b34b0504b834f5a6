"""Scheduler registrations and schedules written with the store and ops functions the real
processes and the CLI use, for the API and console tests of the cluster pages."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine

from sasflow.ops import schedules as schedule_ops
from sasflow.registry import Registry
from sasflow.schedules.definition import Schedule
from sasflow.store.cluster import registrations as scheduler_store
from sasflow.store.db import run_transaction


def register_scheduler(
    engine: Engine, name: str, *, lease_ttl: float = 300.0, assignment: str = "acquire"
) -> str:
    """Register scheduler `name` (alarm threshold 5, strategy `assignment`) with a lease of
    `lease_ttl` seconds, as a starting `sasflow scheduler` does; its registration id."""
    reg = scheduler_store.Registration(
        id=uuid.uuid4().hex,
        name=name,
        address="127.0.0.1:0",
        hostname="localhost",
        pid=1,
        fault_tolerance=1,
        alarm_threshold=5,
        lease_ttl=lease_ttl,
        assignment=assignment,
    )
    assert run_transaction(engine, lambda conn: scheduler_store.register(conn, reg))
    return reg.id


def add_schedule(engine: Engine, schedule: Schedule, registry: Registry) -> dict[str, Any]:
    """Add `schedule` as `sasflow schedules add` does; its row."""
    return run_transaction(
        engine,
        lambda conn: schedule_ops.add(
            conn, schedule, registry, actor="test", reason=None, namespace="unused"
        ),
    )
