"""The sasflow processes of a chaos run, kept alive like systemd `Restart=always` would.

Each named slot runs one CLI process; when it exits, the fleet starts it again after a short
delay and records whether the exit was one the fault schedule caused (a SIGKILL it sent) or
not. Unexpected exits close together are a crash loop.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

RESTART_DELAY = 0.5
"""Seconds between an exit and the restart (systemd's RestartSec)."""
CRASH_LOOP_EXITS = 4
CRASH_LOOP_WINDOW = 60.0
"""This many unexpected exits of one slot within this many seconds is a crash loop."""


@dataclass(frozen=True)
class Exit:
    at: float
    returncode: int
    expected: bool


@dataclass
class Slot:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    """Variables added to the fleet's for this slot (e.g. a skewed clock)."""
    process: subprocess.Popen[bytes] | None = None
    exits: list[Exit] = field(default_factory=list)
    starts: int = 0
    kill_expected: bool = False
    paused: bool = False
    restart_at: float | None = None

    def crash_looping(self) -> bool:
        unexpected = [e.at for e in self.exits if not e.expected]
        return any(
            sum(1 for u in unexpected if t <= u < t + CRASH_LOOP_WINDOW) >= CRASH_LOOP_EXITS
            for t in unexpected
        )


class Fleet:
    """Start, watch, signal and finally stop the processes; only ever signals its own."""

    def __init__(self, logs: Path, env: dict[str, str], cwd: Path) -> None:
        self.logs = logs
        self.env = env
        self.cwd = cwd
        self.slots: dict[str, Slot] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="chaos-fleet", daemon=True)

    def add(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.slots[name] = Slot(name, [sys.executable, "-m", "sasflow", *args], env or {})

    def start(self) -> None:
        with self.lock:
            for slot in self.slots.values():
                self._spawn(slot)
        self.watcher.start()

    def _spawn(self, slot: Slot) -> None:
        with (self.logs / f"{slot.name}.log").open("ab") as log:
            slot.process = subprocess.Popen(
                slot.argv,
                env={**self.env, **slot.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
            )
        slot.starts += 1
        slot.restart_at = None
        slot.kill_expected = False
        slot.paused = False

    def _watch(self) -> None:
        while not self.stopping.wait(0.2):
            with self.lock:
                now = time.monotonic()
                for slot in self.slots.values():
                    process = slot.process
                    if process is not None and slot.restart_at is None:
                        code = process.poll()
                        if code is not None:
                            slot.exits.append(Exit(time.time(), code, slot.kill_expected))
                            slot.restart_at = now + RESTART_DELAY
                    if slot.restart_at is not None and now >= slot.restart_at:
                        self._spawn(slot)

    def pid(self, name: str) -> int | None:
        process = self.slots[name].process
        return process.pid if process is not None and process.poll() is None else None

    def kill(self, name: str) -> bool:
        """SIGKILL the slot's process (it will be restarted); False if it was not running."""
        with self.lock:
            slot = self.slots[name]
            if slot.process is None or slot.process.poll() is not None:
                return False
            slot.kill_expected = True
            slot.process.send_signal(signal.SIGKILL)
            return True

    def pause(self, name: str) -> bool:
        with self.lock:
            slot = self.slots[name]
            if slot.process is None or slot.process.poll() is not None or slot.paused:
                return False
            slot.process.send_signal(signal.SIGSTOP)
            slot.paused = True
            return True

    def resume(self, name: str) -> None:
        with self.lock:
            slot = self.slots[name]
            if slot.paused and slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGCONT)
            slot.paused = False

    def resume_all(self) -> None:
        for name in self.slots:
            self.resume(name)

    def all_running(self) -> bool:
        with self.lock:
            return all(
                s.process is not None and s.process.poll() is None and not s.paused
                for s in self.slots.values()
            )

    def stop(self) -> None:
        """SIGCONT what is paused, SIGTERM everything, SIGKILL what is left after 20 s."""
        self.stopping.set()
        if self.watcher.is_alive():
            self.watcher.join(5)
        with self.lock:
            running = [
                s.process
                for s in self.slots.values()
                if s.process is not None and s.process.poll() is None
            ]
            for slot in self.slots.values():
                if slot.paused and slot.process is not None and slot.process.poll() is None:
                    slot.process.send_signal(signal.SIGCONT)
            for process in running:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for process in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            if process.poll() is None:
                process.kill()
                process.wait(5)
