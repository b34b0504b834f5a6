"""What the chaos run feeds the system: submissions (with duplicates), poison messages on
every queue, and stale-attempt replies, all published over AMQP like an outside producer."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, or_, select
from sqlalchemy.exc import SQLAlchemyError

from sasflow.store.schema import steps
from sasflow.transport.topology import Names
from tests.chaos.app import order
from tests.chaos.broker import Publisher
from tests.chaos.sessions import account_for

POISON_HEADER = "x-chaos-poison"
STALE_MARK = "stale-reply-injected-by-chaos"
NO_STEP = 2_000_000_000
"""A step id no run reaches: poison requests must not name live steps (the supervisor counts
a dead-lettered request as a failure of the step and attempt it names)."""


def submission(key: str, work: float, *, variant: int = 0) -> bytes:
    run_input = {"work": work, "variant": variant, "account": account_for(key)}
    return json.dumps({"workflow": order.name, "key": key, "input": run_input}).encode()


@dataclass
class Submissions:
    """What the driver got confirmed: keys, and how many duplicates of them."""

    keys: list[str] = field(default_factory=list)
    duplicates: int = 0
    unconfirmed: list[str] = field(default_factory=list)
    once: set[str] = field(default_factory=set)
    """Keys of other workflows' runs (`Driver.submit_once`): never submitted again."""
    lock: threading.Lock = field(default_factory=threading.Lock)


class Driver(threading.Thread):
    """Submit `runs` runs evenly over `window` seconds, re-publishing some keys (sometimes
    with another input, which the submitter must ignore)."""

    def __init__(
        self,
        url: str,
        names: Names,
        *,
        runs: int,
        window: float,
        seed: int,
        duplicate_rate: float,
        prefix: str,
        progress: Callable[[], float] = lambda: 1.0,
    ) -> None:
        super().__init__(name="chaos-driver", daemon=True)
        self.publisher = Publisher(url)
        self.names = names
        self.runs = runs
        self.window = window
        self.rng = random.Random(seed)  # noqa: S311 - reproducible
        self.duplicate_rate = duplicate_rate
        self.prefix = prefix
        self.progress = progress
        """Share of the fault schedule done: submissions keep pace with it, so the load
        spans every fault even when service restarts make the schedule run late."""
        self.result = Submissions()
        self.stop = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        try:
            for i in range(self.runs):
                if self.stop.is_set():
                    break
                key = f"{self.prefix}-{i}"
                work = round(self.rng.uniform(0.1, 0.8), 3)  # keeps steps in flight
                self._send(key, submission(key, work))
                if self.rng.random() < self.duplicate_rate:
                    self.duplicate_some(self.publisher, self.rng, 1, variant=1)
                pause = started + (i + 1) * self.window / self.runs - time.monotonic()
                if pause > 0:
                    self.stop.wait(pause)
                while self.progress() < (i + 1) / self.runs and not self.stop.wait(0.1):
                    pass
        finally:
            self.publisher.close()

    def _send(
        self, key: str, body: bytes, *, duplicate: bool = False, publisher: Publisher | None = None
    ) -> bool:
        ok = (publisher or self.publisher).publish(
            self.names.submit, body, deadline=time.monotonic() + 120
        )
        with self.result.lock:
            if not ok:
                self.result.unconfirmed.append(key)
            elif duplicate:
                self.result.duplicates += 1
            else:
                self.result.keys.append(key)
        return ok

    def probe(self, publisher: Publisher, key: str) -> bool:
        """Submit one more run (from the calling thread) to time the recovery with."""
        return self._send(key, submission(key, 0.0), publisher=publisher)

    def submit_once(self, publisher: Publisher, key: str, body: bytes) -> bool:
        """Submit one run of another workflow (`body`, from the calling thread), counted with
        the others but never chosen as a duplicate (it would be another workflow's run)."""
        with self.result.lock:
            self.result.once.add(key)
        return self._send(key, body, publisher=publisher)

    def duplicate_some(
        self, publisher: Publisher, rng: random.Random, count: int, *, variant: int
    ) -> None:
        """Submit `count` confirmed keys again, with another input (`publisher` and `rng`
        belong to the calling thread)."""
        with self.result.lock:
            known = [key for key in self.result.keys if key not in self.result.once]
        for key in rng.sample(known, min(count, len(known))):
            self._send(
                key, submission(key, 0.0, variant=variant), duplicate=True, publisher=publisher
            )


@dataclass(frozen=True)
class Poison:
    id: str
    queue: str
    kind: str


def poison_messages(names: Names, agents: list[str], tag: str) -> list[tuple[Poison, bytes]]:
    """One of each kind of bad message per queue: malformed, wrong schema, oversized, ..."""
    big = "x" * 300_000
    request = {
        "v": 1,
        "step_id": NO_STEP,
        "run_id": NO_STEP,
        "attempt": 1,
        "workflow": order.name,
        "step": "reserve",
        "action": "reserve",
        "kind": "forward",
        "input": {},
        "idempotency_key": "0" * 32,
        "budget_ms": 1000,
        "complete_by": "2030-01-01T00:00:00+00:00",
    }
    items: list[tuple[str, str, bytes]] = [
        (names.submit, "malformed", b'{"workflow": "chaos_order", "key": '),
        (names.submit, "not-an-object", b"[1, 2, 3]"),
        (names.submit, "wrong-schema", json.dumps({"workflow": 42, "key": [1]}).encode()),
        (
            names.submit,
            "unknown-workflow",
            json.dumps({"workflow": "no_such_flow", "key": f"poison-{tag}"}).encode(),
        ),
        (
            names.submit,
            "oversized",
            json.dumps({"workflow": order.name, "key": big, "input": {}}).encode(),
        ),
        (names.replies, "malformed", b"\xff\xfe not utf-8"),
        (
            names.replies,
            "nan",
            b'{"step_id": %d, "attempt": 1, "status": "ok", "output": NaN}' % NO_STEP,
        ),
        (
            names.replies,
            "wrong-schema",
            json.dumps({"step_id": NO_STEP, "attempt": 1, "status": "bogus"}).encode(),
        ),
        (
            names.replies,
            "missing-error",
            json.dumps({"step_id": NO_STEP, "attempt": 1, "status": "error"}).encode(),
        ),
        (
            names.replies,
            "oversized",
            json.dumps({"step_id": NO_STEP, "attempt": 1, "status": big}).encode(),
        ),
    ]
    for agent in agents:
        queue = names.agent(agent)
        other = next((a for a in agents if a != agent), "nobody")
        items += [
            (queue, "malformed", b"{{{"),
            (queue, "wrong-schema", json.dumps({"v": 1, "step_id": "seven"}).encode()),
            (queue, "wrong-version", json.dumps({**request, "v": 2, "agent": agent}).encode()),
            (queue, "wrong-agent", json.dumps({**request, "agent": other}).encode()),
            (queue, "oversized", json.dumps({**request, "agent": agent, "attempt": big}).encode()),
        ]
    return [
        (Poison(f"{tag}-{n}", queue, kind), body) for n, (queue, kind, body) in enumerate(items)
    ]


def inject_poison(publisher: Publisher, names: Names, agents: list[str], tag: str) -> list[Poison]:
    """Publish one batch; return those the broker confirmed."""
    sent = []
    for poison, body in poison_messages(names, agents, tag):
        if publisher.publish(
            poison.queue, body, headers={POISON_HEADER: poison.id}, deadline=time.monotonic() + 60
        ):
            sent.append(poison)
    return sent


def inject_stale_replies(
    publisher: Publisher, engine: Engine, names: Names, rng: random.Random, count: int
) -> int:
    """Replies `ok` for attempts that are not (or no longer) the step's current one: an older
    attempt of a step in flight, or the completed attempt of a processed step again. The
    scheduler must drop them all; their output carries a mark the checker looks for."""
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(steps.c.id, steps.c.state, steps.c.attempt)
                .where(
                    or_(
                        steps.c.state == "processed",
                        (steps.c.state == "processing") & (steps.c.attempt >= 2),
                    )
                )
                .order_by(steps.c.id.desc())
                .limit(500)
            ).all()
    except SQLAlchemyError:
        return 0
    sent = 0
    for row in rng.sample(rows, min(count, len(rows))):
        attempt = row.attempt if row.state == "processed" else row.attempt - 1
        body: dict[str, Any] = {
            "v": 1,
            "step_id": row.id,
            "attempt": attempt,
            "status": "ok",
            "output": {"mark": STALE_MARK, "attempt": attempt},
            "agent": "chaos",
        }
        if publisher.publish(
            names.replies,
            json.dumps(body).encode(),
            correlation_id=f"{row.id}:{attempt}",
            deadline=time.monotonic() + 30,
        ):
            sent += 1
    return sent
