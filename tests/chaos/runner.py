"""One chaos run: start the services and the fleet, submit under the fault schedule, heal,
check the invariants. Every phase is bounded in time; `close()` undoes everything started,
and runs on failure, at exit and (from `python -m tests.chaos`) on SIGINT/SIGTERM too."""

from __future__ import annotations

import atexit
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import SQLAlchemyError

from sasflow.store.db import make_engine
from sasflow.store.schema import runs, steps
from sasflow.transport.topology import Names
from tests.chaos import faults as faultplan
from tests.chaos import long_steps, waits
from tests.chaos.app import CONSUMER_TIMEOUT
from tests.chaos.broker import Publisher, drain
from tests.chaos.checks import Observed, Report, check
from tests.chaos.cluster_faults import Cluster
from tests.chaos.concurrency import define_limit
from tests.chaos.faults import Fault, Injected, Injector
from tests.chaos.fleet import Fleet
from tests.chaos.instances import ServiceError
from tests.chaos.recovery import SettleWatch, first_step_done, in_flight
from tests.chaos.remote import RemoteService
from tests.chaos.stacks import SingleNode, Stack
from tests.chaos.workload import Driver, Poison, inject_poison, inject_stale_replies

REPO = Path(__file__).resolve().parents[2]
AGENTS = ["alpha", "beta"]
SUPERVISOR_INTERVAL = 0.5
PROBE_TIMEOUT = 60.0
"""Seconds a fault's recovery is waited for before it is reported as `never`."""
SKEW_SITE = Path(__file__).resolve().parent / "skew"
"""Its sitecustomize.py shifts a process's wall clock (time.time, datetime.now)."""
CLOCK_SKEW = {"scheduler-2": 90.0, "alpha-2": -90.0, "supervisor-2": 30.0}
"""Seconds the processes' wall clocks are off the database's, as on hosts whose clocks
drifted: every deadline and backoff is on the database clock, so none of them may matter."""
WAIT_SHARE = 10
"""One `chaos_wait` run (a timer and an event wait, tests/chaos/waits.py) per this many runs,
submitted besides them."""
PAST_DEADLINE_SLACK = 2.0
"""Seconds past `complete_by + sweep interval` before a `processing` step counts as left
behind: one sweep may be running when the deadline passes."""


@dataclass(frozen=True)
class ChaosConfig:
    runs: int = 300
    seed: int = 1
    duration: float = 100.0
    """Seconds of the fault window; submissions are spread over its first 85 %."""
    heal_timeout: float = 120.0
    duplicate_rate: float = 0.1
    agents_per_name: int = 2
    logs: Path | None = None
    """Where the processes' logs are kept (default: removed with the run's directory)."""
    cluster: bool = False
    """On the local cluster (three RabbitMQ nodes, quorum queues, a PostgreSQL primary and its
    synchronous standby) with its faults, instead of one instance of each."""
    cluster_dir: Path | None = None
    """With `cluster`: the state directory of a running cluster (`scripts/cluster start`) to
    use and leave running, instead of one of the run's own."""
    early_acks: bool = True
    """Whether the agents are told the broker's consumer timeout (app.CONSUMER_TIMEOUT); if
    not, they acknowledge every request after its reply and the long steps' check fails."""
    account_concurrency: int | None = 1
    """The flow limit on `charge` per account (tests/chaos/concurrency.py); None: none
    defined (the invariant then shows what the limit prevents)."""


@dataclass
class ChaosRun:
    config: ChaosConfig
    say: Callable[[str], None] = print
    root: Path = field(init=False)
    poison: list[Poison] = field(default_factory=list)
    stale_sent: int = 0
    probes: list[str] = field(default_factory=list)
    closed: bool = False

    def __post_init__(self) -> None:
        run_id = uuid.uuid4().hex[:8]
        self.root = Path(tempfile.mkdtemp(prefix=f"sasflow-chaos-{run_id}-"))
        self.root.chmod(0o755)  # the postgres user must reach its data directory
        self.logs = self.config.logs or self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.names = Names(f"chaos{run_id}")
        self.remote = RemoteService()
        self.stack: Stack = (
            Cluster(
                self.root,
                self.config.cluster_dir,
                self.names,
                consumer_timeout=CONSUMER_TIMEOUT,
            )
            if self.config.cluster
            else SingleNode(self.root, run_id, consumer_timeout=CONSUMER_TIMEOUT)
        )
        self.fleet: Fleet | None = None
        self.engine: Engine | None = None
        self.rng = random.Random(self.config.seed * 7919 + 1)  # noqa: S311 - reproducible
        atexit.register(self.close)

    # -- setup ---------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            **self.stack.environment(),
            "SASFLOW_DATABASE_URL": self.stack.database_url,
            "SASFLOW_BROKER_URL": self.stack.broker_url,
            "SASFLOW_NAMESPACE": self.names.namespace,
            "SASFLOW_APP": "tests.chaos.app",
            "SASFLOW_CHAOS_REMOTE_URL": self.remote.url,
            **long_steps.agent_environment(CONSUMER_TIMEOUT, self.config.early_acks),
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
        }

    def start(self) -> None:
        started = time.monotonic()
        try:
            self.stack.start()
        except (ServiceError, OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceError(
                f"the chaos suite could not start its own service instances: {exc}"
            ) from exc
        self.remote.start()
        env = self._env()
        subprocess.run(
            [sys.executable, "-m", "sasflow", "db", "upgrade"],
            env=env,
            cwd=REPO,
            check=True,
            capture_output=True,
            timeout=120,
        )
        self.engine = make_engine(
            self.stack.admin_url, application_name="sasflow-chaos", pool_size=2
        )
        self.say(f"[chaos] {define_limit(env, REPO, self.config.account_concurrency)}")
        fleet = Fleet(self.logs, env, REPO)
        skews = self.skews()
        fleet.add("submitter", "submitter")
        for n in (1, 2):
            fleet.add(
                f"scheduler-{n}",
                "scheduler",
                "--rescan-interval",
                "0.5",
                env=skews.get(f"scheduler-{n}"),
            )
            fleet.add(
                f"supervisor-{n}",
                "supervisor",
                "--interval",
                str(SUPERVISOR_INTERVAL),
                "--lease-ttl",
                "3",
                env=skews.get(f"supervisor-{n}"),
            )
        for agent in AGENTS:
            for n in range(1, self.config.agents_per_name + 1):
                fleet.add(
                    f"{agent}-{n}",
                    "agent",
                    agent,
                    "--concurrency",
                    "4",
                    env=skews.get(f"{agent}-{n}"),
                )
        self.fleet = fleet
        fleet.start()
        self.say(
            f"[chaos] services and {len(fleet.slots)} processes up in "
            f"{time.monotonic() - started:.1f}s ({self.stack.describe()}, "
            f"ns {self.names.namespace}); "
            f"clock skew: {self.skew_note()}"
        )

    def skews(self) -> dict[str, dict[str, str]]:
        """The environment that skews each skewed slot's wall clock."""
        return {
            slot: {
                "SASFLOW_CHAOS_CLOCK_SKEW": str(offset),
                "PYTHONPATH": f"{SKEW_SITE}{os.pathsep}{REPO}",
            }
            for slot, offset in CLOCK_SKEW.items()
        }

    def skew_note(self) -> str:
        return ", ".join(f"{slot} {offset:+.0f}s" for slot, offset in CLOCK_SKEW.items())

    # -- faults --------------------------------------------------------------------------

    def _slots_by_role(self) -> dict[str, list[str]]:
        assert self.fleet is not None
        roles: dict[str, list[str]] = {
            "agent": [],
            "scheduler": [],
            "supervisor": [],
            "submitter": [],
        }
        for name in self.fleet.slots:
            role = name.split("-")[0]
            roles["agent" if role in AGENTS else role].append(name)
        return roles

    def _watch_settling(self) -> object:
        """Started as each fault begins: watches the steps in flight at that moment."""
        assert self.engine is not None
        watch = SettleWatch(self.engine, in_flight(self.engine), PROBE_TIMEOUT)
        watch.start()
        return watch

    def _recovery(
        self, record: Injected, watch: object, driver: Driver, publisher: Publisher
    ) -> None:
        """Submit a probe run once the fault is over and wait (bounded) for its first step;
        collect when the steps in flight at the fault's start had settled."""
        assert self.engine is not None
        hit = self.stack.began()
        if hit is not None:
            record.started = hit  # not when its target was being looked for
        key = f"probe-{self.config.seed}-{len(self.probes)}"
        self.probes.append(key)
        if driver.probe(publisher, key):
            done = first_step_done(self.engine, key, PROBE_TIMEOUT)
            record.recovery = None if done is None else done - record.started
        if isinstance(watch, SettleWatch):
            record.in_flight = len(watch.steps_in_flight)
            settled = watch.result()
            if record.in_flight:
                # 0 when they settled before a cluster fault hit (its target being looked for)
                record.settled = None if settled is None else max(0.0, settled - record.started)

    def _actions(
        self, driver: Driver, publisher: Publisher, long: long_steps.LongSteps
    ) -> dict[str, Callable[[Fault], str]]:
        assert self.fleet is not None
        assert self.engine is not None
        fleet, engine = self.fleet, self.engine

        def kill(fault: Fault) -> str:
            before = fleet.pid(fault.target)
            if not fleet.kill(fault.target):
                return "was not running"
            deadline = time.monotonic() + 15
            while fleet.pid(fault.target) in (None, before) and time.monotonic() < deadline:
                time.sleep(0.1)
            return f"pid {before} -> {fleet.pid(fault.target)}"

        def pause(fault: Fault) -> str:
            if not fleet.pause(fault.target):
                return "was not running"
            time.sleep(fault.hold)
            fleet.resume(fault.target)
            return f"SIGSTOP for {fault.hold}s"

        def poison(fault: Fault) -> str:
            sent = inject_poison(publisher, self.names, AGENTS, f"p{len(self.poison)}")
            self.poison.extend(sent)
            return f"{len(sent)} poison messages"

        def duplicates(fault: Fault) -> str:
            driver.duplicate_some(publisher, self.rng, 20, variant=2)
            return "20 keys submitted again"

        def stale(fault: Fault) -> str:
            sent = inject_stale_replies(publisher, engine, self.names, self.rng, 30)
            self.stale_sent += sent
            return f"{sent} stale replies"

        actions: dict[str, Callable[[Fault], str]] = {
            **self.stack.actions(fleet),
            "poison": poison,
            "duplicates": duplicates,
            "stale_replies": stale,
            "long_steps": lambda _fault: long.inject(publisher),
        }
        for kind in faultplan.PROCESS_FAULTS:
            actions[kind] = kill if kind.startswith("kill") else pause
        return actions

    # -- heal and check ------------------------------------------------------------------

    def _progress(self) -> tuple[int, int, int, int]:
        """(runs found, runs not completed, steps in flight, steps processing past deadline)."""
        assert self.engine is not None
        limit = SUPERVISOR_INTERVAL + PAST_DEADLINE_SLACK
        with self.engine.connect() as conn:
            found = conn.execute(select(func.count()).select_from(runs)).scalar_one()
            open_runs = conn.execute(
                select(func.count()).select_from(runs).where(runs.c.state != "completed")
            ).scalar_one()
            busy = conn.execute(
                select(func.count())
                .select_from(steps)
                .where(steps.c.state.in_(("pending", "processing")))
            ).scalar_one()
            late = conn.execute(
                select(func.count())
                .select_from(steps)
                .where(
                    steps.c.state == "processing",
                    steps.c.complete_by < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, limit),
                )
            ).scalar_one()
        return found, open_runs, busy, late

    def _heal(self, keys: list[str]) -> tuple[bool, float, int, int]:
        assert self.fleet is not None
        started = time.monotonic()
        self.fleet.resume_all()
        self.stack.ensure_running()
        deadline = started + self.config.heal_timeout
        while not self.fleet.all_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        grace = time.monotonic() + 3 + SUPERVISOR_INTERVAL + PAST_DEADLINE_SLACK  # lease TTL
        worst, healed, progress = 0, False, (0, 0, 0, 0)
        while time.monotonic() < deadline:
            try:
                progress = self._progress()
            except SQLAlchemyError:
                time.sleep(1)
                continue
            found, open_runs, busy, late = progress
            if time.monotonic() > grace:
                worst = max(worst, late)
            if found >= len(keys) and open_runs == 0 and busy == 0:
                healed = True
                break
            time.sleep(1)
        self.say(
            f"[chaos] heal: {'quiet' if healed else 'NOT quiet'} after "
            f"{time.monotonic() - started:.1f}s (runs found/open, steps busy/late: "
            f"{progress})"
        )
        return healed, time.monotonic() - started, worst, progress[3]

    def execute(self) -> Report:
        """The whole run; the caller calls `close()` (also registered at exit)."""
        self.start()
        assert self.fleet is not None
        assert self.engine is not None
        config = self.config
        weights = faultplan.CLUSTER_WEIGHTS if config.cluster else faultplan.WEIGHTS
        slots = {**self._slots_by_role(), **self.stack.targets()}
        schedule = faultplan.plan(config.seed, config.duration, slots, weights)
        injector = Injector(schedule, {}, self.say)
        driver = Driver(
            self.stack.broker_url,
            self.names,
            runs=config.runs,
            window=config.duration * 0.85,
            seed=config.seed,
            duplicate_rate=config.duplicate_rate,
            prefix=f"s{config.seed}",
            progress=injector.progress,
        )
        publisher = Publisher(self.stack.broker_url)  # owned by the injector's thread
        waiting = waits.WaitDriver(
            self.stack.broker_url,
            self.names,
            self.engine,
            driver,
            seed=config.seed,
            count=max(len(waits.KINDS), config.runs // WAIT_SHARE),
            window=config.duration * 0.85,
            progress=injector.progress,
        )
        long = long_steps.LongSteps(
            self.engine,
            driver,
            config.seed,
            long_steps.BrokerLogs([node.log_file for node in self.stack.brokers()]),
        )
        injector.actions = self._actions(driver, publisher, long)
        injector.ready = self.stack.ready
        injector.before = self._watch_settling
        injector.after = lambda record, snapshot: self._recovery(
            record, snapshot, driver, publisher
        )
        self.say(
            f"[chaos] seed {config.seed}: {config.runs} runs over "
            f"{config.duration * 0.85:.0f}s, {len(schedule)} faults over "
            f"{config.duration:.0f}s"
        )
        driver.start()
        waiting.start()
        injector.start()
        finished = injector.finish(timeout=config.duration + 120)
        publisher.close()
        driver.join(timeout=config.duration + 180)
        driver.stop.set()
        driver.join(timeout=150)
        waiting.join(timeout=waits.TAIL_S + 150)
        waiting.stop.set()
        waiting.join(timeout=150)
        if not finished or driver.is_alive() or waiting.is_alive():
            raise RuntimeError("the fault injector or the driver did not stop in time")
        keys = list(driver.result.keys)
        healed, heal_seconds, worst, final = self._heal(keys)
        self.fleet.stop()
        dead = drain(self.stack.broker_url, self.names.dead_letter_queue)
        calls, effects = self.remote.ledger.snapshot()
        sessions, late_effects = self.remote.sessions.snapshot()
        seen = Observed(
            submissions=driver.result,
            calls=calls,
            effects=effects,
            slots=list(self.fleet.slots.values()),
            poison=self.poison,
            dead=dead,
            stale_sent=self.stale_sent,
            past_deadline_max=worst,
            past_deadline_final=final,
            injected=injector.injected,
            healed=healed,
            heal_seconds=heal_seconds,
            fault_errors=injector.errors,
            fault_types=tuple(weights),
            sessions=sessions,
            late_effects=late_effects,
            account_limit=config.account_concurrency,
        )
        report = check(self.engine, seen)
        told = CONSUMER_TIMEOUT if config.early_acks else 0.0
        long.check(report, calls, told)
        waiting.check(report)
        return report

    def close(self) -> None:
        """Stop what this run started and remove its directory (idempotent)."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        if self.fleet is not None:
            self.fleet.stop()
        if self.engine is not None:
            self.engine.dispose()
        self.remote.stop()
        self.stack.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def run(config: ChaosConfig, say: Callable[[str], None] = print) -> Report:
    chaos = ChaosRun(config, say)
    try:
        report = chaos.execute()
    finally:
        chaos.close()
    say(report.text())
    return report
