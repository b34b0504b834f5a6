"""The blocks of a Markdown page that a test executes: those after `<!-- doc-run: NAME/STEP -->`."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKED = re.compile(
    r"^<!--\s*doc-run:\s*(?P<name>[\w-]+)(?:/(?P<step>[\w-]+))?\s*-->\n"
    r"(?P<fence>```+)(?:sh|bash)\n(?P<body>.*?)^(?P=fence)\s*$",
    re.MULTILINE | re.DOTALL,
)


@dataclass(frozen=True)
class DocBlock:
    step: str
    lines: tuple[str, ...]


def doc_run_blocks(page: str, name: str) -> list[DocBlock]:
    """The shell blocks of `page` (relative to the repository) marked `doc-run: name[/step]`,
    in page order, each as its commands (continuations joined, comments and blanks dropped)."""
    text = (REPO / page).read_text(encoding="utf-8")
    found: list[DocBlock] = []
    for match in MARKED.finditer(text):
        if match["name"] != name:
            continue
        joined = match["body"].replace("\\\n", " ")
        lines = tuple(
            line.strip()
            for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")
        )
        found.append(DocBlock(match["step"] or name, lines))
    return found


SHELL_BLOCK = re.compile(
    r"^[ \t]*(?P<fence>```+)(?:sh|bash)\n(?P<body>.*?)^[ \t]*(?P=fence)\s*$",
    re.MULTILINE | re.DOTALL,
)


def shell_commands(page: str, program: str) -> list[list[str]]:
    """Every command of `page`'s shell blocks that runs `program`, as argv (comments dropped)."""
    text = (REPO / page).read_text(encoding="utf-8")
    found: list[list[str]] = []
    for match in SHELL_BLOCK.finditer(text):
        for line in match["body"].replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == program:
                found.append(words)
    return found
