"""The doc checker and the reference generator: the committed docs pass, and they catch what
they exist to catch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.docs.markdown import REPO


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )


def test_every_command_in_the_docs_is_checked_or_exercised() -> None:
    done = _script("scripts/check_docs.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""


def test_the_committed_references_are_up_to_date() -> None:
    done = _script("scripts/gen_reference.py", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_stale_reference_is_reported_with_its_diff(tmp_path: Path) -> None:
    (tmp_path / "cli.md").write_text((REPO / "docs/reference/cli.md").read_text())
    (tmp_path / "configuration.md").write_text("# Configuration reference\n\nold text\n")
    done = _script("scripts/gen_reference.py", "--check", "--directory", str(tmp_path))
    assert done.returncode == 1
    assert "configuration.md is stale" in done.stderr
    assert "cli.md is stale" not in done.stderr
    assert "-old text" in done.stdout
    assert "+| `SASFLOW_DATABASE_URL`" in done.stdout
    assert (tmp_path / "configuration.md").read_text().endswith("old text\n"), "--check wrote"


def test_the_checker_refuses_what_the_cli_does_not_have() -> None:
    verdicts = {
        "sasflow runs show 3": "ok",
        "sasflow runs list --state error --since 2h -o json": "ok",
        "sasflow --app examples.quickstart runs list": "ok",
        "SASFLOW_LOG_LEVEL=WARNING sasflow supervisor --once --budget 50 &": "ok",
        "./scripts/demo --orders 20": "ok",
        "sasflow runs shw 3": "has no command 'shw'",
        "sasflow runs list --bogus": "No such option '--bogus'",
        "sasflow runs list --state nope": "'nope' is not one of",
        "sasflow runs list --limit many": "'many' is not a valid integer range",
        "sasflow runs show 1 2": "unexpected arguments ['2']",
        "sasflow runs resubmit 3": "missing reason",
        "sasflow submit": "missing WORKFLOW",
        "sasflow submit order --input": "requires an argument",
        "sasflow runs": "no command given",
        "python bench/missing.py": "does not exist",
        "./scripts/nothing": "is not a file of the repo",
        "wget http://localhost": "`wget` is neither sasflow",
        "sasflow runs list | jq .": "`jq` is neither sasflow",
        ".venv/bin/python -m tests.chaos --runs 3 --seed 1": "ok",
        "python -m tests.chaos --runs 3 --bogus 1": "has no option --bogus",
        "python -m tests.nothere": "`python` is neither sasflow",
    }
    args = [a for line in verdicts for a in ("--command", line)]
    done = _script("scripts/check_docs.py", *args)
    assert done.returncode == 1
    got = dict(line.split("\t", 1) for line in done.stdout.splitlines())
    for line, expected in verdicts.items():
        assert (got[line] == "ok") if expected == "ok" else (expected in got[line]), (
            line,
            got[line],
        )


def test_the_checker_finds_broken_links_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "concepts.md").write_text((REPO / "docs/concepts.md").read_text())
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## A section, with `code`\n\n"
        "[ok](#a-section-with-code) [ok](concepts.md#guarantees) "
        "[ok](https://example.com/x) `[not a link](nowhere.md)`\n"
        "[bad](nowhere.md) [bad](concepts.md#no-such-heading) [bad](#missing)\n"
    )
    done = _script("scripts/check_docs.py", "--links", str(page))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "link to nowhere.md: no such file",
        "link to concepts.md#no-such-heading: no heading #no-such-heading there",
        "link to #missing: no heading #missing there",
    ]
