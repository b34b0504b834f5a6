"""How long a cancel takes to stop a running program at its agent (docs/operations.md,
cancelling a run): from the commit of `ops.cancel` to the death of the handler's `sleep 600`.

    python bench/cancel.py [--runs 10]

In a scratch database and namespace on the local services: a scheduler and an agent (threads of
this process, RabbitMQ), then `--runs` runs one after another, each with one step whose handler
runs `sleep 600`; each is cancelled once its program runs. Prints the median and the largest
delay, and the relay interval that bounds most of it (the cancel goes out with the relay's next
pass). Everything is dropped at the end.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import scratch, wait_until
from bench.report import machine_line, say
from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.agents.children import ChildProcesses, start_ticks
from sasflow.agents.worker import AgentOptions, AgentWorker
from sasflow.ops.cancel import cancel
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.transport.rabbitmq import RabbitMQTransport
from tests import services


def _alive(pid: int) -> bool:
    if start_ticks(pid) is None:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"


def _dead(pid: int) -> bool:
    return not _alive(pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    agent = Agent("sleeper")

    @agent.handler("sleep")
    def sleep(call: Call) -> None:
        call.run(["sleep", "600"])

    registry = Registry(
        [Workflow("nap", [Step("only", "sleeper", "sleep", policy=StepPolicy(timeout=600))])],
        [agent],
    )
    say(machine_line())
    options = SchedulerOptions()
    delays = []
    with (
        tempfile.TemporaryDirectory() as state_dir,
        scratch("cancel", ["sleeper"]) as (url, engine, names),
    ):
        pid_files = Path(state_dir)
        scheduler = Scheduler(
            engine,
            RabbitMQTransport(services.broker_url(), process_name="bench-scheduler"),
            registry,
            names,
            database_url=url,
            options=options,
        )
        worker = AgentWorker(
            agent,
            RabbitMQTransport(services.broker_url(), process_name="bench-agent"),
            names,
            options=AgentOptions(children=ChildProcesses(pid_files)),
        )
        threads = [threading.Thread(target=r.run, daemon=True) for r in (scheduler, worker)]
        for thread in threads:
            thread.start()
        try:
            for i in range(args.runs):
                with engine.begin() as conn:
                    run_id = submit_run(
                        conn, registry, "nap", {}, key=f"c{i}", namespace=names.namespace
                    ).run_id
                if not wait_until(lambda: any(pid_files.glob("*.json")), 30):
                    raise SystemExit("the program never started")
                pid = int(next(pid_files.glob("*.json")).stem)
                with engine.begin() as conn:
                    cancel(conn, run_id, actor="bench", reason="bench", namespace=names.namespace)
                committed = time.monotonic()
                if not wait_until(functools.partial(_dead, pid), 30, interval=0.005):
                    raise SystemExit("the program outlived its cancel by 30 s")
                delays.append(time.monotonic() - committed)
                wait_until(lambda: not any(pid_files.glob("*.json")), 5)
        finally:
            scheduler.stop()
            worker.stop_event.set()
            for thread in threads:
                thread.join(30)
    median = statistics.median(delays)
    say(
        f"cancel -> program dead over {len(delays)} runs: median {median:.3f} s, "
        f"max {max(delays):.3f} s (relay interval {options.relay_interval:g} s; grace unused: "
        "sleep dies on SIGTERM)"
    )


if __name__ == "__main__":
    main()
