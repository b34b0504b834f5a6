"""The seeded fault schedule and the thread that carries it out.

`plan()` is a pure function of the seed: the same seed gives the same faults at the same
offsets against the same targets. Every fault type appears at least once; extra faults are
drawn with weights that favour the cheap process faults over service restarts.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

PROCESS_FAULTS = (
    "kill_agent",
    "stop_agent",
    "kill_scheduler",
    "stop_scheduler",
    "kill_supervisor",
    "stop_supervisor",
    "kill_submitter",
)
SERVICE_FAULTS = (
    "rabbit_stop_app",
    "rabbit_kill",
    "rabbit_freeze",
    "rabbit_disk_alarm",
    "pg_restart",
    "pg_read_only",
    "pg_connection_limit",
)
MESSAGE_FAULTS = ("poison", "duplicates", "stale_replies")
LOAD_FAULTS = ("long_steps",)
"""Work the system must carry through the other faults: `long_steps` submits runs whose step
works longer than the broker's consumer timeout (tests/chaos/long_steps.py)."""
ALL_FAULTS = PROCESS_FAULTS + SERVICE_FAULTS + MESSAGE_FAULTS + LOAD_FAULTS
WEIGHTS = {
    **dict.fromkeys(PROCESS_FAULTS, 4),
    **dict.fromkeys(SERVICE_FAULTS, 1),
    **dict.fromkeys(MESSAGE_FAULTS, 2),
    **dict.fromkeys(LOAD_FAULTS, 2),
}
CLUSTER_FAULTS = (
    "leader_kill_agent",
    "leader_kill_submit",
    "leader_kill_replies",
    "node_kill_other",
    "queue_delete",
    "pg_failover",
)
"""The local cluster's (`--cluster`): a RabbitMQ node SIGKILLed (the one leading an agent queue,
the submit or the replies queue, or one leading no agent queue), a queue deleted under its
consumers, the PostgreSQL standby promoted and the old primary fenced."""
CLUSTER_RUN = CLUSTER_FAULTS + MESSAGE_FAULTS + LOAD_FAULTS
CLUSTER_WEIGHTS = {
    **dict.fromkeys(CLUSTER_FAULTS, 3),
    **dict.fromkeys(MESSAGE_FAULTS, 1),
    **dict.fromkeys(LOAD_FAULTS, 1),
}


@dataclass(frozen=True)
class Fault:
    at: float
    """Seconds after the fault window opened."""
    kind: str
    target: str
    """The fleet slot for process faults, else the service or queue set."""
    hold: float
    """Seconds a SIGSTOP or a broker stop lasts."""


@dataclass
class Injected:
    fault: Fault
    started: float
    ended: float
    """Wall-clock times (the database clock is this machine's clock), for recovery times."""
    done: bool
    note: str = ""
    recovery: float | None = None
    """Fault start -> the first step of a probe run submitted once the fault was over."""
    settled: float | None = None
    in_flight: int = 0
    """Steps processing when the fault began (no settling time without any)."""
    """Fault start -> every step in flight at the fault's start finished or re-queued
    (watched from the fault's start, so it may be shorter than the fault itself)."""


def plan(
    seed: int,
    window: float,
    slots: dict[str, list[str]],
    weights: dict[str, int] | None = None,
) -> list[Fault]:
    """The schedule for `window` seconds: one fault every ~6 s, each type at least once.

    `slots` maps a role (agent, scheduler, supervisor, submitter) to its fleet slot names, and
    a fault kind to what it may hit (a kind it does not name hits its service); `weights`, the
    fault kinds and their weights (default WEIGHTS: every kind of the single-node run).
    """
    weights = WEIGHTS if weights is None else weights
    rng = random.Random(seed)  # noqa: S311 - a reproducible schedule, not a secret
    count = max(len(weights), int(window / 6))
    kinds = list(weights)
    kinds += rng.choices(list(weights), weights=list(weights.values()), k=count - len(kinds))
    rng.shuffle(kinds)
    step = window / (count + 1)
    faults = []
    for n, kind in enumerate(kinds):
        at = round(step * (n + 1) + rng.uniform(-step / 4, step / 4), 2)
        role = kind.split("_", 1)[1] if kind in PROCESS_FAULTS else kind
        target = rng.choice(slots[role]) if role in slots else kind.split("_", 1)[0]
        hold = round(rng.uniform(1.0, 8.0), 2)  # often past the 4 s step timeout
        faults.append(Fault(at, kind, target, hold))
    return faults


def _seconds(value: float | None) -> str:
    return "  never" if value is None else f"{value:6.2f}s"


@dataclass
class Injector:
    """Carries out a plan in order on its own thread; each fault's action blocks until the
    fault is over (process restarted by the fleet, service back)."""

    faults: list[Fault]
    actions: dict[str, Callable[[Fault], str]]
    log: Callable[[str], None]
    injected: list[Injected] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    errors: list[str] = field(default_factory=list)
    ready: Callable[[], None] = lambda: None
    """Called before each fault's clock starts (waits until the last fault was undone)."""
    before: Callable[[], object] = lambda: None
    """Snapshot taken before each fault, handed to `after`."""
    after: Callable[[Injected, object], None] = lambda _record, _snapshot: None
    """Measures the recovery once the fault is over (blocks the schedule, bounded)."""
    started_count: int = 0
    last_start: float = 0.0

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="chaos-faults", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        opened = time.monotonic()
        for fault in self.faults:
            if self.stop.wait(max(0.0, opened + fault.at - time.monotonic())):
                return
            try:
                self.ready()
            except Exception as exc:  # noqa: BLE001 - reported like a failed fault
                self.errors.append(f"before {fault.kind}: {type(exc).__name__}: {exc}")
            self.started_count += 1
            self.last_start = time.monotonic()
            started = time.time()
            try:
                snapshot = self.before()  # e.g. start watching what is in flight now
                note = self.actions[fault.kind](fault)
                done = True
            except Exception as exc:  # noqa: BLE001 - a failed fault is reported, not fatal
                snapshot, note, done = None, f"{type(exc).__name__}: {exc}", False
                self.errors.append(f"{fault.kind} on {fault.target}: {note}")
            record = Injected(fault, started, time.time(), done, note)
            try:
                self.after(record, snapshot)
            except Exception as exc:  # noqa: BLE001 - reported like a failed fault
                self.errors.append(f"measuring {fault.kind}: {type(exc).__name__}: {exc}")
            self.injected.append(record)
            self.log(
                f"fault {fault.kind:<16} {fault.target:<12} "
                f"{record.ended - started:5.1f}s recovered {_seconds(record.recovery)} "
                f"settled {_seconds(record.settled)} ({record.in_flight} in flight)  "
                f"{note}"
            )

    def progress(self) -> float:
        """Share of the schedule done: a fault counts once started, and the planned gap after
        it in proportion to the time since (1.0 once the schedule is over)."""
        if not self.faults or (self.thread is not None and not self.thread.is_alive()):
            return 1.0
        if self.started_count == 0:
            return 0.0
        gap = (
            self.faults[0].at
            if len(self.faults) == 1
            else (self.faults[-1].at - self.faults[0].at) / (len(self.faults) - 1)
        )
        into = min(1.0, (time.monotonic() - self.last_start) / max(gap, 0.1))
        return min(1.0, (self.started_count - 1 + into) / len(self.faults))

    def finish(self, timeout: float) -> bool:
        """Let the plan run out for up to `timeout` seconds, then cancel what is left (the
        fault in progress still completes: it restores what it broke)."""
        if self.thread is None:
            return True
        self.thread.join(timeout)
        self.stop.set()
        self.thread.join(180)
        return not self.thread.is_alive()
