"""Run documentation command lines the way bash would, for the few forms the docs use.

Anything else (pipes, `&&`, substitutions other than `kill $(jobs -p)`) is refused, so a page
that starts using more shell than this understands fails its test instead of being half-run.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

Rewrite = Callable[[list[str]], list[str]]
UNSUPPORTED = {"|", "||", "&&", ";", "<"}


@dataclass
class DocShell:
    """One shell session: its directory, its exported variables and its background jobs.

    `overrides` replace the values the page exports (a test's own database, broker and
    namespace instead of the page's); `rewrites` turn a program's argv into the test's (for
    `createdb`, the test's database name and server)."""

    cwd: Path
    env: dict[str, str]
    overrides: Mapping[str, str] = field(default_factory=dict)
    rewrites: Mapping[str, Rewrite] = field(default_factory=dict)
    exported: dict[str, str] = field(default_factory=dict)
    jobs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    stopped: dict[str, int] = field(default_factory=dict)

    def run(self, line: str) -> subprocess.CompletedProcess[str] | None:
        """Run one line; a foreground command must exit 0. Returns its output, or None for a
        line that only changes the session (export, a background job, kill)."""
        if line == "kill $(jobs -p)":
            self.stop_all()
            return None
        words = shlex.split(line, comments=True)
        if any(w in UNSUPPORTED or w.startswith("$(") or "`" in w for w in words):
            raise AssertionError(f"the doc test does not understand this shell: {line!r}")
        if words[0] == "export":
            for assignment in words[1:]:
                name, _, value = assignment.partition("=")
                self.exported[name] = value
                self.env[name] = self.overrides.get(name, value)
            return None
        background = words[-1] == "&"
        words = words[:-1] if background else words
        output = None
        if len(words) > 3 and words[-3] == ">" and words[-1] == "2>&1":
            output, words = words[-2], words[:-3]
        if any(w.startswith((">", "2>")) for w in words):
            raise AssertionError(f"unsupported redirection in {line!r}")
        argv = self._argv(words)
        if background:
            log = self.cwd / (output or f"job-{len(self.jobs)}.log")
            with log.open("ab") as sink:
                self.jobs[line] = subprocess.Popen(
                    argv, cwd=self.cwd, env=self.env, stdout=sink, stderr=subprocess.STDOUT
                )
            return None
        if output is not None:
            raise AssertionError(f"foreground redirection is not supported: {line!r}")
        done = subprocess.run(
            argv,
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{line!r} exited {done.returncode}: {done.stderr}"
        return done

    def _argv(self, words: list[str]) -> list[str]:
        if words[0] in self.rewrites:
            words = self.rewrites[words[0]](words)
        if words[0] == "sasflow":
            return [sys.executable, "-m", "sasflow", *words[1:]]
        return words

    def assert_jobs_alive(self) -> None:
        dead = {line: job.returncode for line, job in self.jobs.items() if job.poll() is not None}
        assert not dead, f"background jobs exited early: {dead}"

    def stop_all(self, timeout: float = 30) -> None:
        """SIGTERM every background job (what `kill $(jobs -p)` does), then wait for them;
        their exit codes land in `stopped`. Jobs still alive after `timeout` are killed."""
        for job in self.jobs.values():
            if job.poll() is None:
                job.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for line, job in self.jobs.items():
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.wait(max(0.1, deadline - time.monotonic()))
            if job.poll() is None:
                job.kill()
                job.wait(5)
            self.stopped[line] = job.returncode
        self.jobs.clear()
