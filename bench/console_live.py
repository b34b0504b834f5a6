"""The console's live pages: what open pages cost the database while nothing happens, and how
soon a new run shows on an open runs list.

    python bench/console_live.py [--pages 50] [--runs 100] [--rate 10]

Starts `sasflow api` (a process) on a scratch PostgreSQL database and namespace, signs in
with a `read` token and opens `--pages` live runs lists (`/ui/runs/live`, Server-Sent Events)
whose filter matches nothing, plus one that shows workflow `one`.

1. Idle, no scheduler: the database's committed transactions per second (pg_stat_database)
   with no page open, then with the pages open, and the API server's CPU over the same time.
2. Busy: a scheduler and an agent (threads of this process) run `--runs` one-step runs
   submitted at `--rate` runs/s; each run is timed from its submission's commit to the first
   message of the `one` list that shows it. Prints p50, p95 and p99 in milliseconds, and the
   transactions per second meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from sqlalchemy import Engine, text

from bench.apps import noop, registry
from bench.common import cpu_seconds, scratch, wait_until
from bench.report import load_line, machine_line, percentile
from sasflow import submit_run
from tests import harness, services
from tests.api.server import ApiServer, api_server, make_token

WINDOW_S = 10.0


def _signed_in(server: ApiServer, token: str) -> httpx.Client:
    client = httpx.Client(base_url=server.base_url, timeout=60)
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/login").text)
    if found is None:
        raise SystemExit("no CSRF field on the sign-in page")
    client.post("/ui/login", data={"csrf": found.group(1), "token": token, "next": "/ui"})
    return client


def _commits(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
        )


def _rate(engine: Engine, pid: int) -> tuple[float, float]:
    """(transactions/s, API CPU s/s) over WINDOW_S; the statistics lag up to 0.5 s."""
    time.sleep(1.0)
    commits, cpu = _commits(engine), cpu_seconds(pid)
    time.sleep(WINDOW_S)
    time.sleep(1.0)  # the statistics collector's flush
    return (_commits(engine) - commits - 1) / WINDOW_S, (cpu_seconds(pid) - cpu) / WINDOW_S


class Page:
    """One open live page: a thread reading its stream, noting when each run first shows."""

    def __init__(self, client: httpx.Client, url: str) -> None:
        self.seen: dict[int, float] = {}
        self.messages = 0
        self.open = threading.Event()
        self._client, self._url = client, url
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(httpx.HTTPError), self._client.stream("GET", self._url) as answer:
            self.open.set()
            for line in answer.iter_lines():
                if line.startswith("data: {"):
                    self.messages += 1
                    now = time.perf_counter()
                    for run in re.findall(r"/ui/runs/(\d+)", line):
                        self.seen.setdefault(int(run), now)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rate", type=float, default=10.0)
    args = parser.parse_args()
    print(machine_line())
    print(load_line())
    with (
        tempfile.TemporaryDirectory(prefix="sasflow-bench-") as logs,
        scratch("console", ["noop"]) as (url, engine, names),
        api_server(
            Path(logs),
            database_url=url,
            broker_url=services.broker_url(),
            namespace=names.namespace,
            app="bench.apps",
        ) as server,
    ):
        pid = server.process.pid
        client = _signed_in(server, make_token(engine, "bench", "read"))
        idle_before = _rate(engine, pid)
        pages = [Page(client, "/ui/runs/live?text=nothing-matches") for _ in range(args.pages)]
        watched = Page(client, "/ui/runs/live?workflow=one")
        wait_until(lambda: all(p.open.is_set() for p in [*pages, watched]), 60)
        time.sleep(5)  # each page's first read is done
        idle_open = _rate(engine, pid)
        print(f"idle, no scheduler ({WINDOW_S:g} s each):")
        before, cpu = idle_before
        print(f"  no live page open: {before:.1f} transactions/s, API CPU {cpu:.3f} s/s")
        print(
            f"  {args.pages + 1} live pages open: {idle_open[0]:.1f} transactions/s, "
            f"API CPU {idle_open[1]:.3f} s/s"
        )
        submitted: dict[int, float] = {}
        with harness.running(
            harness.scheduler(engine, url, registry, names), harness.agent(noop, names)
        ):
            commits, started = _commits(engine), time.perf_counter()
            for i in range(args.runs):
                began = time.perf_counter()
                with engine.begin() as conn:
                    run = submit_run(
                        conn, registry, "one", {"i": i}, key=f"b{i}", namespace=names.namespace
                    )
                submitted[run.run_id] = time.perf_counter()
                time.sleep(max(0.0, 1 / args.rate - (time.perf_counter() - began)))
            wait_until(lambda: all(r in watched.seen for r in submitted), 30)
            busy = (_commits(engine) - commits) / (time.perf_counter() - started)
        client.close()
    shown = [(watched.seen[r] - t) * 1000 for r, t in submitted.items() if r in watched.seen]
    print(f"busy: {args.runs} one-step runs at {args.rate:g}/s, {args.pages + 1} pages open:")
    print(
        f"  submit -> shown on the open list {len(shown)}/{args.runs}: "
        f"p50 {statistics.median(shown):.0f} ms, p95 {percentile(shown, 0.95):.0f} ms, "
        f"p99 {percentile(shown, 0.99):.0f} ms"
    )
    print(f"  {busy:.0f} transactions/s in all (scheduler, agent replies, live pages)")
    quiet = sum(p.messages for p in pages)
    print(f"  messages to the {args.pages} lists matching nothing: {quiet} (the first, each)")


if __name__ == "__main__":
    main()
