"""How the W1/W2 forms submit their runs while the roles drain them.

- `UpFront` (W1, W2): one `submit_run` call per run, all in one transaction, so the whole
  backlog appears at one commit; the window starts at that commit.
- `Concurrent` (W1c, W2c): application client processes (bench/workloads/client.py), each
  submitting one run per transaction with `submit_run`; the window starts at the first run's
  `created_at` (the start of the first submitting transaction, database clock).
- `Broker` (W1s): the bench publishes one submission message per run to `<ns>.submit`
  (persistent, confirmed in batches, as bench/api.py) and a `sasflow submitter` process records
  them; the window starts just before the first publish (database clock).

Each is used as: `prepare` (before the CPU baseline), `start` (the clock starts), `finish`
(every run is recorded: the submission rate); `close` at the end whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Engine, text

from bench import apps
from bench.common import analyze, database_clock, wait_until
from sasflow import submit_run
from sasflow.messages import Submission
from sasflow.transport.base import Outgoing
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names, declare_common
from tests import harness
from tests.acceptance.processes import REPO, Processes

PUBLISH_BATCH = 200
"""Submission messages per confirmed publish batch (the submitter's default prefetch)."""
READY_TIMEOUT = 60.0


@dataclass
class Submitted:
    start: float
    """Where the drain's window starts: database clock, epoch seconds."""
    rate: float
    """Runs recorded per second by this path (while the roles drain)."""
    note: str
    """What to print about the submission."""
    cpu_ms: float | None = None
    """Client CPU milliseconds per submission, when the clients report it."""


class Form(Protocol):
    def prepare(self, procs: Processes) -> None: ...

    def start(self) -> None: ...

    def finish(self, timeout: float) -> Submitted: ...

    def close(self) -> None: ...


def runs_after(engine: Engine, floor: int) -> tuple[int, int, float, float]:
    """Runs with an id above `floor`: how many, how many completed, the first `created_at` and
    the last `finished_at` among them (epoch seconds, database clock; 0 when none)."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT count(*), count(*) FILTER (WHERE state = 'completed'), "
                "coalesce(extract(epoch FROM min(created_at)), 0), "
                "coalesce(extract(epoch FROM max(finished_at)), 0) FROM runs WHERE id > :f"
            ),
            {"f": floor},
        ).one()
    return int(row[0]), int(row[1]), float(row[2]), float(row[3])


class UpFront:
    """W1, W2: the whole backlog in one transaction, before the clock starts."""

    def __init__(
        self,
        engine: Engine,
        names: Names,
        workflow: str,
        count: int,
        prefix: str,
        *,
        analyze_tables: bool,
    ) -> None:
        self._engine, self._names = engine, names
        self._workflow, self._count, self._prefix = workflow, count, prefix
        self._analyze = analyze_tables
        self._result: Submitted | None = None

    def prepare(self, procs: Processes) -> None:
        pass

    def start(self) -> None:
        started = time.perf_counter()
        analyzed = ""
        with self._engine.begin() as conn:
            for i in range(self._count):
                submit_run(
                    conn,
                    apps.registry,
                    self._workflow,
                    {"i": i},
                    key=f"{self._prefix}{i}",
                    namespace=self._names.namespace,
                )
            if self._analyze:
                took = analyze(conn)
                analyzed = f", ANALYZE before the commit {took * 1000:.0f} ms (autovacuum off)"
        committed = database_clock(self._engine)
        took = time.perf_counter() - started
        self._result = Submitted(
            committed,
            self._count / took,
            f"submitted {self._count:,} {self._workflow} runs in one transaction in {took:.1f}s"
            f"{analyzed}",
        )

    def finish(self, timeout: float) -> Submitted:  # noqa: ARG002 - submitted at start
        if self._result is None:
            raise RuntimeError("finish() before start()")
        return self._result

    def close(self) -> None:
        pass


class Concurrent:
    """W1c, W2c: application client processes, one run per transaction, while they drain."""

    def __init__(
        self, engine: Engine, workflow: str, count: int, prefix: str, *, clients: int, floor: int
    ) -> None:
        self._engine = engine
        self._workflow, self._count, self._prefix = workflow, count, prefix
        self._clients = clients
        self._floor = floor
        self._started: list[subprocess.Popen[str]] = []

    def prepare(self, procs: Processes) -> None:
        share, extra = divmod(self._count, self._clients)
        first = 0
        for n in range(self._clients):
            count = share + (1 if n < extra else 0)
            self._started.append(
                subprocess.Popen(  # noqa: S603 - this package's module, the same interpreter
                    [
                        sys.executable,
                        "-m",
                        "bench.workloads.client",
                        self._workflow,
                        self._prefix,
                        str(first),
                        str(count),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    cwd=REPO,
                    env=procs.env,
                )
            )
            first += count
        for client in self._started:
            out = client.stdout
            if out is None:
                raise RuntimeError("an application client's output is not a pipe")
            ready, _, _ = select.select([out], [], [], READY_TIMEOUT)
            if not ready or out.readline().strip() != "ready":
                raise RuntimeError(f"an application client did not start ({client.poll()})")

    def start(self) -> None:
        for client in self._started:
            if client.stdin is None:
                raise RuntimeError("an application client's input is not a pipe")
            client.stdin.write("go\n")
            client.stdin.flush()

    def finish(self, timeout: float) -> Submitted:
        deadline = time.monotonic() + timeout
        reports = []
        for client in self._started:
            out, _ = client.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if client.returncode != 0 or not out.strip():
                raise RuntimeError(f"an application client failed ({client.returncode})")
            reports.append(json.loads(out.strip().splitlines()[-1]))
        window = max(r["end"] for r in reports) - min(r["start"] for r in reports)
        cpu = sum(r["cpu"] for r in reports)
        _, _, first, _ = runs_after(self._engine, self._floor)
        rate = self._count / window
        return Submitted(
            first,
            rate,
            f"{self._clients} client processes submitted {self._count:,} {self._workflow} runs, "
            f"one per transaction, in {window:.1f}s ({rate:.0f}/s)",
            cpu * 1000 / self._count,
        )

    def close(self) -> None:
        for client in self._started:
            if client.poll() is None:
                client.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                client.communicate(timeout=5)


class Broker:
    """W1s: one submission message per run to `<ns>.submit`, recorded by the submitter."""

    def __init__(
        self, engine: Engine, names: Names, workflow: str, count: int, prefix: str, *, floor: int
    ) -> None:
        self._engine, self._names, self._workflow = engine, names, workflow
        self._count, self._prefix, self._floor = count, prefix, floor
        self._transport: RabbitMQTransport | None = None
        self._messages: list[Outgoing] = []
        self._clock = (0.0, 0.0)  # database clock and perf_counter at the first publish
        self._published = 0.0

    def prepare(self, procs: Processes) -> None:  # noqa: ARG002 - the bench publishes itself
        self._transport = harness.transport("bench-publisher")
        self._transport.connect()
        declare_common(self._transport, self._names)
        self._messages = [
            Outgoing(
                "",
                self._names.submit,
                Submission(
                    workflow=self._workflow, input={"i": i}, key=f"{self._prefix}{i}"
                ).encode(),
            )
            for i in range(self._count)
        ]

    def start(self) -> None:
        if self._transport is None:
            raise RuntimeError("start() before prepare()")
        self._clock = (database_clock(self._engine), time.perf_counter())
        for first in range(0, self._count, PUBLISH_BATCH):
            refused = [
                e
                for e in self._transport.publish_many(self._messages[first : first + PUBLISH_BATCH])
                if e is not None
            ]
            if refused:
                raise RuntimeError(f"publish failed: {refused[0]}")
        self._published = time.perf_counter() - self._clock[1]

    def _recorded(self) -> int:
        with self._engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM runs WHERE id > :f"), {"f": self._floor}
                ).scalar_one()
            )

    def finish(self, timeout: float) -> Submitted:
        if not wait_until(lambda: self._recorded() >= self._count, timeout, interval=0.05):
            raise RuntimeError(f"the submitter recorded only {self._recorded()}/{self._count}")
        took = time.perf_counter() - self._clock[1]
        return Submitted(
            self._clock[0],
            self._count / took,
            f"published {self._count:,} submissions to {self._names.submit} in "
            f"{self._published:.1f}s ({self._count / self._published:.0f}/s, confirmed per "
            f"{PUBLISH_BATCH}); the submitter recorded them in {took:.1f}s "
            f"({self._count / took:.0f}/s)",
        )

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
