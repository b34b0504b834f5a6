"""Programs run by handlers (`Call.run`): output tails, exit codes, and a process group that
never outlives its step (deadline, abort, a dead predecessor's leftovers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sasflow.agents.children import ChildProcesses, start_ticks
from sasflow.agents.errors import ChildKilledError
from tests import harness

pytestmark = pytest.mark.integration

# A shell that starts a background sleep (a grandchild in the same group) and waits: the
# whole group must die, not only the program the handler started.
SLEEPERS = ["sh", "-c", "sleep 600 & echo started; wait"]


def _alive(pid: int) -> bool:
    ticks = start_ticks(pid)
    if ticks is None:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    return state != "Z"  # a zombie is dead, only not yet waited for


def _group(pgid: int) -> list[int]:
    """The live processes of group `pgid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _pid_files(state_dir: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in state_dir.glob("*.json")]


def test_a_program_that_exits_returns_its_code_and_output_tails(tmp_path: Path) -> None:
    children = ChildProcesses(tmp_path)
    done = children.run(
        ["sh", "-c", 'printf "%s" "$GREETING"; echo oops >&2; exit 3'],
        deadline=time.monotonic() + 30,
        abort=threading.Event(),
        env={"GREETING": "x" * 100 + "end"},
        cwd=tmp_path,
        tail_bytes=10,
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, "xxxxxxxend", "oops\n")
    assert done.truncated
    assert _pid_files(tmp_path) == [], "the pid file outlived the program"


def test_argv_must_be_a_list_of_strings() -> None:
    children = ChildProcesses()
    with pytest.raises(TypeError):
        children.run("sleep 1", deadline=time.monotonic() + 5, abort=threading.Event())
    with pytest.raises(TypeError):
        children.run(["sleep", 1], deadline=time.monotonic() + 5, abort=threading.Event())  # type: ignore[list-item]


def test_the_whole_group_is_killed_when_the_deadline_passes(tmp_path: Path) -> None:
    children = ChildProcesses(tmp_path)
    started = time.monotonic()
    seen: list[dict[str, object]] = []

    def watch() -> None:
        harness.wait_for(lambda: bool(_pid_files(tmp_path)), what="the pid file")
        seen.extend(_pid_files(tmp_path))

    watcher = threading.Thread(target=watch)
    watcher.start()
    with pytest.raises(ChildKilledError, match="deadline"):
        children.run(SLEEPERS, deadline=started + 1.0, abort=threading.Event(), grace=0.5)
    watcher.join()
    assert time.monotonic() - started < 5
    (record,) = seen
    assert _group(int(str(record["pid"]))) == [], "the group outlived the deadline"


def test_abort_kills_the_group_even_if_it_ignores_sigterm(tmp_path: Path) -> None:
    children = ChildProcesses(tmp_path)
    abort = threading.Event()
    stubborn = ["sh", "-c", "trap '' TERM; sleep 600 & wait; wait"]
    threading.Timer(0.5, abort.set).start()
    started = time.monotonic()
    with pytest.raises(ChildKilledError, match="gave up"):
        children.run(stubborn, deadline=started + 600, abort=abort, grace=0.5)
    assert 0.5 <= time.monotonic() - started < 5


def test_a_restarted_agent_kills_the_groups_its_dead_predecessor_left(tmp_path: Path) -> None:
    """A predecessor (a real process, killed with SIGKILL) left a program running; the next
    instance finds its pid file and kills the group; a live instance's files are left alone."""
    script = (
        "import sys, threading, time\n"
        "from pathlib import Path\n"
        "from sasflow.agents.children import ChildProcesses\n"
        "ChildProcesses(Path(sys.argv[1])).run(['sleep', '600'], deadline=time.monotonic()"
        " + 600, abort=threading.Event())\n"
    )
    predecessor = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)])
    try:
        harness.wait_for(lambda: bool(_pid_files(tmp_path)), what="the pid file")
        (record,) = _pid_files(tmp_path)
        sleeper = int(str(record["pid"]))
        # Alive, the predecessor's programs are not ours to kill.
        assert ChildProcesses(tmp_path).reap_orphans() == []
        assert _alive(sleeper)
        os.kill(predecessor.pid, signal.SIGKILL)
        predecessor.wait()
        assert _alive(sleeper), "the program died with its agent: nothing left to test"
        assert ChildProcesses(tmp_path).reap_orphans(grace=1.0) == [sleeper]
        harness.wait_for(lambda: not _alive(sleeper), timeout=5, what="the orphan is gone")
        assert _pid_files(tmp_path) == []
    finally:
        predecessor.kill()
        predecessor.wait()


def test_a_pid_reused_by_another_program_is_not_killed(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        (tmp_path / f"{bystander.pid}.json").write_text(
            json.dumps(
                {
                    "pid": bystander.pid,
                    "start": (start_ticks(bystander.pid) or 0) - 1,  # another program's
                    "argv": ["sleep", "600"],
                    "owner_pid": 2**22 + 1,  # no such process
                    "owner_start": 1,
                }
            )
        )
        assert ChildProcesses(tmp_path).reap_orphans() == []
        assert bystander.poll() is None
        assert _pid_files(tmp_path) == []
    finally:
        bystander.kill()
        bystander.wait()


def test_the_state_directory_is_created_by_the_first_program_only(tmp_path: Path) -> None:
    """Most agents never run a program: they leave no directory behind."""
    state_dir = tmp_path / "agents" / "echo"
    children = ChildProcesses(state_dir)
    assert children.reap_orphans() == []
    assert not state_dir.exists()
    children.run(["true"], deadline=time.monotonic() + 30, abort=threading.Event())
    assert state_dir.is_dir()
