"""External programs run by handlers: each in its own process group, never outliving the step.

`Call.run(argv, env=..., cwd=...)` starts the program with `start_new_session` (a new session,
so a new process group whose id is the program's pid), captures the tail of its output, and
kills the whole group (SIGTERM, then SIGKILL after `grace` seconds) when the step's deadline
passes or the agent gives up on the call (its drain timeout ran out). Whatever the program
left running in its group when it exits is killed the same way.

With a state directory, each running program has a pid file there (its pid and start time,
and its agent's), so an agent that starts after a predecessor died (kill -9, OOM, power cut)
kills the groups that predecessor left (`reap_orphans`). Process start times come from Linux's
/proc, which also guards against a pid reused by an unrelated process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from sasflow.agents.errors import ChildKilledError

log = logging.getLogger(__name__)

DEFAULT_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL of a program's process group."""
DEFAULT_TAIL_BYTES = 8192
"""Bytes of stdout and of stderr kept (the end of each)."""
_POLL = 0.05


@dataclass(frozen=True)
class Completed:
    """A program that ran to its end."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    """The last bytes of its standard output (UTF-8, invalid bytes replaced)."""
    stderr: str
    seconds: float
    truncated: bool
    """Some output was dropped from the front of stdout or stderr."""


class _Tail:
    """Reads a pipe to its end in a thread, keeping only its last `limit` bytes."""

    def __init__(self, pipe: IO[bytes], limit: int) -> None:
        self._pipe = pipe
        self._limit = limit
        self._data = bytearray()
        self.truncated = False
        self._thread = threading.Thread(target=self._read, daemon=True, name="child-output")
        self._thread.start()

    def _read(self) -> None:
        with self._pipe:
            for chunk in iter(lambda: os.read(self._pipe.fileno(), 65536), b""):
                self._data += chunk
                if len(self._data) > self._limit:
                    del self._data[: len(self._data) - self._limit]
                    self.truncated = True

    def text(self, timeout: float) -> str:
        self._thread.join(timeout)
        return bytes(self._data).decode("utf-8", "replace")


def default_state_dir(namespace: str, agent: str) -> Path:
    """`$XDG_STATE_HOME/sasflow/<namespace>/<agent>` (`~/.local/state/...` by default): one
    directory per agent, shared by its instances on this machine (each leaves the others'
    programs alone while they live)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sasflow" / namespace / agent


def start_ticks(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (/proc), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return int(stat.rpartition(")")[2].split()[19])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, grace: float) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after `grace` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _group_alive(pgid):
        _reap_zombie(pgid)
        time.sleep(_POLL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _reap_zombie(pid: int) -> None:
    """A dead child of ours stays a zombie (still in its group) until waited for."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


class ChildProcesses:
    """The programs one agent process runs, with their pid files in `state_dir` (if any)."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = state_dir
        self._owner = {"owner_pid": os.getpid(), "owner_start": start_ticks(os.getpid())}

    def run(
        self,
        argv: Sequence[str],
        *,
        deadline: float,
        abort: threading.Event,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        grace: float = DEFAULT_GRACE,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
    ) -> Completed:
        """Run `argv` (no shell) to its end; ChildKilledError when `deadline` (a monotonic
        time) passes or `abort` is set first. `env` adds to (or overrides) the agent's own
        environment. OSError when the program cannot be started."""
        if isinstance(argv, str | bytes) or not all(isinstance(a, str) for a in argv):
            raise TypeError("argv must be a sequence of strings")
        if not argv:
            raise ValueError("argv must name a program")
        if self.state_dir is not None:  # created on first use: most agents never run programs
            self.state_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        process = subprocess.Popen(  # noqa: S603 - argv is a list, never a shell
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env={**os.environ, **env} if env is not None else None,
            start_new_session=True,
        )
        try:
            pid_file = self._record(process.pid, argv)
        except BaseException:  # no pid file (a full disk...): never leave the program behind
            kill_group(process.pid, grace)
            process.wait()
            raise
        # Both are pipes (PIPE above), never None.
        out = _Tail(cast("IO[bytes]", process.stdout), tail_bytes)
        err = _Tail(cast("IO[bytes]", process.stderr), tail_bytes)
        try:
            killed_because = self._wait(process, deadline, abort, grace)
        finally:
            if pid_file is not None:
                pid_file.unlink(missing_ok=True)
        stdout, stderr = out.text(grace), err.text(grace)
        if killed_because is not None:
            raise ChildKilledError(f"{argv[0]} killed: {killed_because}")
        return Completed(
            argv=tuple(argv),
            returncode=process.returncode,
            stdout=stdout,
            stderr=stderr,
            seconds=time.monotonic() - started,
            truncated=out.truncated or err.truncated,
        )

    @staticmethod
    def _wait(
        process: subprocess.Popen[bytes], deadline: float, abort: threading.Event, grace: float
    ) -> str | None:
        """Wait for the program; kill its group on the deadline or abort (returns why) and,
        once it exited, whatever it left behind in its group."""
        try:
            while True:
                try:
                    process.wait(min(_POLL * 4, max(0.0, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    pass
                if abort.is_set():
                    kill_group(process.pid, grace)
                    return "the agent gave up on the step (stopping, or the step was cancelled)"
                if time.monotonic() >= deadline:
                    kill_group(process.pid, grace)
                    return "the step's deadline passed"
        finally:
            if process.returncode is None:  # interrupted (KeyboardInterrupt...): never leak it
                kill_group(process.pid, grace)
            process.wait()
        if _group_alive(process.pid):
            kill_group(process.pid, grace)
        return None

    # -- pid files ------------------------------------------------------------------------

    def _record(self, pid: int, argv: Sequence[str]) -> Path | None:
        if self.state_dir is None:
            return None
        path = self.state_dir / f"{pid}.json"
        record = {"pid": pid, "start": start_ticks(pid), "argv": list(argv)[:20], **self._owner}
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record))
        temporary.replace(path)
        return path

    def reap_orphans(self, grace: float = DEFAULT_GRACE) -> list[int]:
        """Kill the process groups of pid files left by agent processes that are gone; the
        group ids killed. Files of a live agent (another instance sharing the directory) are
        left alone; a pid now used by another program (start time differs) is not touched."""
        if self.state_dir is None or not self.state_dir.is_dir():
            return []
        killed = []
        for path in sorted(self.state_dir.glob("*.json")):
            try:
                record = json.loads(path.read_text())
                pid, start = int(record["pid"]), record["start"]
                owner_pid, owner_start = int(record["owner_pid"]), record["owner_start"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable pid file %s: %s", path, exc)
                path.unlink(missing_ok=True)
                continue
            if owner_start is not None and start_ticks(owner_pid) == owner_start:
                continue  # its agent is alive: not ours to touch
            now = start_ticks(pid)
            # The leader is ours, or gone: a group id cannot be reused while any of its
            # members live, so whatever is left in group `pid` is the orphan's.
            if now is not None and now != start:
                log.info("pid %s of %s was reused by another program: not killed", pid, path)
            elif _group_alive(pid):
                log.warning("killing process group %s left by a dead agent: %s", pid, record)
                kill_group(pid, grace)
                killed.append(pid)
            path.unlink(missing_ok=True)
        return killed
