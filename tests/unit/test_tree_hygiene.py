"""What git tracks must work on any machine: no symlink that is absolute or leaves the
repository, and no file that names an absolute path of a developer's machine (a fresh clone
failed `./scripts/test` on a tracked `.venv-main -> /abs/path/.venv`)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parents[2]

# Home and workspace roots of developers' machines, and the checkout's own location.
MACHINE_PATH = re.compile(
    r"(?<![\w.~-])(?:/home/[A-Za-z_][\w.-]*/|/Users/[A-Za-z_][\w.-]*/|/root/|/work/|"
    r"[A-Za-z]:\\Users\\)"
)


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def _symlinks() -> dict[str, str]:
    """Tracked symlinks (mode 120000) and their targets, as git stores them."""
    links: dict[str, str] = {}
    for line in _git("ls-files", "-s", "-z").split("\0"):
        if line.startswith("120000 "):
            meta, path = line.split("\t", 1)
            links[path] = _git("cat-file", "-p", meta.split()[1])
    return links


def _escapes(path: str, target: str) -> bool:
    if target.startswith("/") or re.match(r"[A-Za-z]:[\\/]", target):
        return True
    depth = 0
    for part in (PurePosixPath(path).parent / target).parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return True
    return False


def _offending_lines(text: str) -> list[str]:
    own = [
        re.compile(rf"(?<![\w.~-]){re.escape(str(place))}(?![\w.-])")
        for place in (REPO, REPO.parent)
        if str(place) != "/"
    ]
    return [
        line.strip()
        for line in text.splitlines()
        if MACHINE_PATH.search(line) or any(place.search(line) for place in own)
    ]


def test_a_symlink_leaving_the_repository_is_caught() -> None:
    """The check itself: absolute targets and `..` past the root are refused."""
    assert _escapes(".venv-main", "/srv/checkout/.venv")
    assert _escapes("docs/x", "../../elsewhere")
    assert not _escapes("docs/x", "../README.md")
    assert not _escapes("a/b/c", "d")


def test_a_machine_path_is_caught() -> None:
    """The check itself: home and workspace roots are found, URLs and package paths are not."""
    assert _offending_lines("run `/work/main/.venv/bin/python`") != []
    assert _offending_lines("see /home/dev/project/x.py") != []
    assert _offending_lines(f"cd {REPO}") != []
    assert _offending_lines("GET /v1/runs and /usr/bin/env python3 and ~/.config/x") == []


def test_no_tracked_symlink_is_absolute_or_leaves_the_repository() -> None:
    """A fresh clone resolves every tracked link inside itself."""
    escaping = {path: target for path, target in _symlinks().items() if _escapes(path, target)}
    assert escaping == {}


def test_no_tracked_file_names_a_path_of_a_developers_machine() -> None:
    """Paths like the checkout's own location or a home folder break on every other machine."""
    found: dict[str, list[str]] = {}
    this = Path(__file__).resolve().relative_to(REPO).as_posix()  # its examples name them
    for path in _git("ls-files", "-z").split("\0"):
        file = REPO / path
        if not path or path == this or file.is_symlink() or not file.is_file():
            continue
        data = file.read_bytes()
        if b"\0" in data:
            continue  # binary (screenshots)
        lines = _offending_lines(data.decode("utf-8", errors="replace"))
        if lines:
            found[path] = lines
    assert found == {}


TRACKER_NUMBER = re.compile(r"\bissues?[- ]?#?\d+\b", re.IGNORECASE)
SHIPPED = ("engine", "agents", "supervisor", "alembic")


def test_a_tracker_number_is_caught() -> None:
    """The check itself: our tracker's numbers, not an upstream bug's."""
    assert TRACKER_NUMBER.search("`acquire` (issue 12) takes unowned schedules")
    assert TRACKER_NUMBER.search("run by compensation, issue-3 supervisor")
    assert not TRACKER_NUMBER.search("can update more rows than the limit (PostgreSQL bug #15715)")


def test_shipped_code_names_no_tracker_number() -> None:
    """Shipped code says what it does and why; which issue asked for it is in git's history."""
    found = [
        f"{path}:{number}: {line.strip()}"
        for path in _git("ls-files", "-z", *SHIPPED).split("\0")
        if path.endswith(".py")
        for number, line in enumerate((REPO / path).read_text(encoding="utf-8").splitlines(), 1)
        if TRACKER_NUMBER.search(line)
    ]
    assert found == []
