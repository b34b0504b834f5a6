"""The supervisor's retention of `<ns>.dead` on RabbitMQ and PostgreSQL: dead letters past their
age, and the oldest beyond the queue's bound, are removed from the head of the queue, each one
recorded (body included) in one `dead.expire` audit record; the first one kept stays at the
head; a quiet queue's head is not taken again before it can be past its age."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pika
import pytest
from sqlalchemy import Engine, func, select

from sasflow.ops.retention import GrowthRetention
from sasflow.store.schema import audit, retention_marks
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.base import Delivery
from sasflow.transport.topology import (
    DEAD_AT_HEADER,
    REASON_HEADER,
    SOURCE_HEADER,
    Names,
    declare_common,
)
from tests import harness, services

pytestmark = pytest.mark.integration

DAY = 86400.0


@pytest.fixture
def dead(names: Names) -> None:
    """The namespace's dead-letter exchange and queues, declared."""
    transport = harness.transport("setup")
    transport.connect()
    try:
        declare_common(transport, names)
    finally:
        transport.close()


def _dead_letter(names: Names, key: str, days_ago: float, body: str | None = None) -> None:
    """A dead-lettered submission, as a sasflow process writes it, `days_ago` days ago."""
    at = datetime.now(UTC) - timedelta(days=days_ago)
    with services.broker_channel() as channel:
        channel.confirm_delivery()
        channel.basic_publish(
            names.dead_letter_exchange,
            names.submit,
            (body or json.dumps({"workflow": "orders", "key": key})).encode(),
            pika.BasicProperties(
                delivery_mode=2,
                correlation_id=key,
                headers={
                    DEAD_AT_HEADER: at.isoformat(),
                    SOURCE_HEADER: names.submit,
                    REASON_HEADER: f"unknown workflow ({key})",
                },
            ),
        )


def _left(names: Names, *, redelivered: bool = False) -> list[str]:
    """The correlation ids left in `<ns>.dead`, in queue order (taken, then handed back);
    with `redelivered`, only those taken and handed back before."""
    with services.broker_channel() as channel:
        found: list[str] = []
        while True:
            method, props, _ = channel.basic_get(names.dead_letter_queue, auto_ack=False)
            if method is None or props is None:
                return found
            if method.redelivered or not redelivered:
                found.append(str(props.correlation_id))


def _supervisor(engine: Engine, names: Names, **growth: Any) -> Supervisor:
    return Supervisor(
        engine,
        names,
        transport=harness.transport("supervisor"),
        options=SupervisorOptions(growth=GrowthRetention(**growth), prune_interval=0),
    )


def _records(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(select(audit).where(audit.c.action == "dead.expire").order_by(audit.c.id))
        )


@pytest.mark.usefixtures("dead")
def test_dead_letters_past_their_age_are_removed_from_the_head_and_audited(
    engine: Engine, names: Names
) -> None:
    big = json.dumps({"workflow": "orders", "key": "old-2", "input": "x" * 3000})
    _dead_letter(names, "old-1", 20)
    _dead_letter(names, "old-2", 15, body=big)
    _dead_letter(names, "recent-1", 1)
    _dead_letter(names, "old-3", 30)  # behind a young one: it waits until that one goes
    _dead_letter(names, "recent-2", 0)
    role = _supervisor(engine, names, dead_letters_keep_s=14 * DAY)
    try:
        report = role.sweep_once()
    finally:
        role.close()
    assert report is not None
    assert report.dead_letters_expired == 2
    assert "dead_letters_expired=2" in report.summary()
    assert _left(names) == ["recent-1", "old-3", "recent-2"]
    (record,) = _records(engine)
    assert record.actor == role.id
    detail = record.detail
    assert (detail["queue"], detail["count"], detail["keep_days"]) == (
        names.dead_letter_queue,
        2,
        14,
    )
    first, second = detail["dead_letters"]
    assert (first["correlation_id"], first["why"]) == ("old-1", "age")
    assert first["source_queue"] == names.submit
    assert first["reason"] == "unknown workflow (old-1)"
    assert first["age_s"] == pytest.approx(20 * DAY, abs=120)
    assert json.loads(first["body"]) == {"workflow": "orders", "key": "old-1"}
    assert first["body_truncated"] is False
    assert second["correlation_id"] == "old-2"
    assert (len(second["body"]), second["body_truncated"]) == (2000, True)
    assert len(first["id"]) == 16  # the id `sasflow dead list` showed


@pytest.mark.usefixtures("dead")
def test_the_oldest_beyond_the_bound_are_removed(engine: Engine, names: Names) -> None:
    for i in range(5):
        _dead_letter(names, f"letter-{i}", 0)
    role = _supervisor(engine, names, dead_letters_max=3)
    try:
        report = role.sweep_once()
    finally:
        role.close()
    assert report is not None
    assert report.dead_letters_expired == 2
    assert _left(names, redelivered=True) == []  # the first one kept was never taken
    assert _left(names) == ["letter-2", "letter-3", "letter-4"]
    (record,) = _records(engine)
    assert [(le["correlation_id"], le["why"]) for le in record.detail["dead_letters"]] == [
        ("letter-0", "bound"),
        ("letter-1", "bound"),
    ]


@pytest.mark.usefixtures("dead")
def test_a_young_head_is_not_taken_again_before_it_can_be_past_its_age(
    engine: Engine, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not by the same supervisor, nor by the next one (a cron run): the time of the next look
    is in the database."""
    _dead_letter(names, "young", 1)
    taken: list[Delivery | None] = []
    for _ in range(2):  # two processes, one after the other
        role = _supervisor(engine, names, dead_letters_keep_s=14 * DAY)
        assert role._transport is not None
        real_get = role._transport.get

        def counting_get(queue: str, real: Any = real_get) -> Delivery | None:
            got: Delivery | None = real(queue)
            if queue == names.dead_letter_queue:
                taken.append(got)
            return got

        monkeypatch.setattr(role._transport, "get", counting_get)
        try:
            for _ in range(2):
                report = role.sweep_once()
                assert report is not None
                assert report.dead_letters_expired == 0
        finally:
            role.lease.release(engine)  # as a cron run does on its way out
            role.close()
    assert len(taken) == 1  # looked at once; again in 13 days
    assert _left(names) == ["young"]
    assert _records(engine) == []
    with engine.connect() as conn:
        due = conn.execute(
            select(retention_marks.c.due_at - func.now()).where(
                retention_marks.c.name == f"dead-letters:{names.dead_letter_queue}"
            )
        ).scalar_one()
    assert due.total_seconds() == pytest.approx(13 * DAY, abs=120)
