"""Check every shell command shown in README.md and docs/**/*.md against the real thing.

A command is a line of a fenced block marked `sh`, `bash` or `shell` (in a `console` block,
a line starting with `$ `), split at `&&`, `||`, `;` and `|`. Each one must be:

- `sasflow ...`: parsed by the real click command tree (the command path exists, every option
  exists on that command and gets its value, choices are valid, no extra arguments);
- a script or file of this repository (`./scripts/demo`, `python bench/run.py`,
  `. scripts/services.sh`): the file exists;
- a module of this repository (`python -m tests.chaos --runs 10`): every `--option` given
  appears in the module's own `--help`;
- a shell builtin that only sets the scene (`export`, `cd`, `set`, assignments);
- or on ALLOWLIST, which names the test (or script run by CI) that exercises it.

It also parses the `sasflow` command lines of the files in deploy/ (cron, systemd units,
Kubernetes manifests), and checks that relative links and their #anchors resolve.

Besides commands, it checks markers (HTML comments on the line before a fenced block):
`<!-- excerpt: PATH -->` says the block is copied verbatim from PATH (it must still be);
`<!-- doc-run: NAME -->` says a test executes the block, and NAME must be in DOC_RUNS with
that test. Exit status 0 when everything holds, 1 with one line per problem otherwise.

    python scripts/check_docs.py
    python scripts/check_docs.py --command 'sasflow runs show 3'   # check given lines
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click

from sasflow.cli.main import cli

REPO = Path(__file__).resolve().parents[1]
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
BUILTINS = {"export", "cd", "set", "unset", "true"}
SOURCE = {".", "source"}
PYTHON = {"python", "python3"}
# Paths inside the virtualenv the docs tell users to create: `.venv/bin/X` runs X.
VENV_BIN = ".venv/bin/"
REPO_DIRS = ("scripts/", "examples/", "docs/", "deploy/", "bench/", "tests/", "alembic/")

# Commands the docs show that are not sasflow's, each with what exercises it: a pytest node
# (`file::test`) or a repository script that CI runs. Keys are the program, or the program and
# its first argument when only that subcommand is exercised.
SHELL_CLIENT = "tests/docs/test_stream_client.py::test_the_shell_client_follows_the_stream"
ALLOWLIST: dict[str, str] = {
    "createdb": "tests/docs/test_tutorial.py::test_tutorial_runs_as_written",
    "touch": "tests/docs/test_tutorial.py::test_tutorial_runs_as_written",
    "rm": "tests/docs/test_tutorial.py::test_tutorial_runs_as_written",
    "grep": "tests/docs/test_tutorial.py::test_tutorial_runs_as_written",
    "kill": "tests/docs/test_tutorial.py::test_tutorial_runs_as_written",
    "python3 -m venv": "scripts/venv.sh",
    "pip install": "scripts/venv.sh",
    "pytest": "scripts/test",
    "rabbitmqctl list_queues": "tests/docs/test_commands.py::test_rabbitmq_commands_of_operations",
    "rabbitmqctl purge_queue": "tests/docs/test_commands.py::test_rabbitmq_commands_of_operations",
    "psql": "tests/services.py::apply_roles_script",
    "curl": "tests/docs/test_api_doc.py::test_the_curl_session_of_the_api_page",
    "sh examples/stream/follow.sh": SHELL_CLIENT,
}

# Blocks marked `<!-- doc-run: NAME -->` and the test that executes them in order.
DOC_RUNS: dict[str, str] = {
    "tutorial": "tests/docs/test_tutorial.py::test_tutorial_runs_as_written",
    "readme-quickstart": "tests/docs/test_tutorial.py::test_readme_quickstart_runs_as_written",
}

# Pages other branches write; a link to one is only noted while it is missing. Empty this once
# they are merged.
PENDING: dict[str, str] = {}
YAML_COMMAND = re.compile(r"^\s*(?:command|args):\s*(?P<argv>\[.*\])\s*$")
UNIT_COMMAND = re.compile(r"/bin/sasflow\s+(?P<args>[^'\"\n]+)")
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*$", re.MULTILINE)
FENCED = re.compile(r"^[ \t]*(```+|~~~+).*?^[ \t]*\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
MARKER = re.compile(r"<!--\s*(?P<kind>excerpt|doc-run):\s*(?P<value>[^\s]+)\s*-->")
# Redirections (`> file`, `2>&1`, `>> log`): not part of the command being checked.
REDIRECT = re.compile(r"(?<!\S)\d?(?:>>|>|<)(?:&\d|\s*[^\s;&|]+)")
OPERATORS = {"&&", "||", "|", ";", "&"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_:.|]*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    text: str
    marker: tuple[str, str] | None


@dataclass(frozen=True)
class Command:
    path: Path
    line: int
    text: str
    words: tuple[str, ...]
    error: str | None = None


def doc_files() -> list[Path]:
    return [
        REPO / "README.md",
        REPO / "deploy" / "README.md",
        *sorted((REPO / "docs").rglob("*.md")),
    ]


def deploy_problems() -> Iterator[str]:
    """The `sasflow` command lines of the cron, systemd and Kubernetes files in deploy/."""
    for path in sorted((REPO / "deploy").rglob("*")):
        if not path.is_file() or path.suffix == ".md":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            argv: list[str] | None = None
            if (listed := YAML_COMMAND.search(line)) is not None:
                argv = json.loads(listed["argv"])
            elif (run := UNIT_COMMAND.search(line)) is not None:
                argv = ["sasflow", *shlex.split(run["args"])]
            if argv and argv[0] == "sasflow":
                problem = check_sasflow(argv[1:])
                if problem:
                    yield f"{path.relative_to(REPO)}:{number}: {problem}"


def blocks(path: Path) -> Iterator[Block]:
    """Fenced blocks of a Markdown file, with the marker comment on the line before, if any."""
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opened = FENCE.match(lines[index])
        if not opened:
            index += 1
            continue
        indent, fence = opened["indent"], opened["fence"]
        previous = lines[index - 1].strip() if index else ""
        found = MARKER.fullmatch(previous)
        body: list[str] = []
        start = index + 1
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            line = lines[index]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            index += 1
        index += 1
        yield Block(
            path,
            start,
            opened["lang"].lower(),
            "\n".join(body) + "\n",
            (found["kind"], found["value"]) if found else None,
        )


def commands(block: Block) -> Iterator[Command]:
    """The commands of a shell block: continuation lines joined, comments, output and
    redirections dropped, split at shell operators."""
    pending = ""
    first = block.line
    for offset, raw in enumerate(block.text.splitlines()):
        line = raw.rstrip()
        if block.language == "console":
            if not pending and not line.startswith("$ "):
                continue
            line = line if pending else line.removeprefix("$ ")
        if not pending:
            first = block.line + offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text, pending = (pending + line).strip(), ""
        try:
            words = split_words(text)
        except ValueError as exc:
            yield Command(block.path, first, text, (), f"cannot parse: {exc}")
            continue
        current: list[str] = []
        for word in [*words, ";"]:
            if word in OPERATORS:
                if current:
                    yield Command(block.path, first, shlex.join(current), tuple(current))
                current = []
            else:
                current.append(word)


def split_words(text: str) -> list[str]:
    """Shell words, operators as words of their own, comments and redirections dropped."""
    lexer = shlex.shlex(REDIRECT.sub(" ", text), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    return list(lexer)


def _strip_assignments(words: list[str]) -> list[str]:
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]
    return words


def check_sasflow(args: list[str]) -> str | None:
    """None if `sasflow ARGS` parses against the real CLI, else why not."""
    command: click.Command = cli
    ctx = click.Context(cli, info_name="sasflow", **cli.context_settings)
    remaining = list(args)
    while True:
        where = f"`{' '.join(_path(ctx))}`"
        try:
            values, extra, _ = command.make_parser(ctx).parse_args(list(remaining))
            _convert_values(command, ctx, values)
        except click.UsageError as exc:
            return f"{where}: {exc.format_message()}"
        asked_help = any(h in remaining for h in ctx.help_option_names)
        if not isinstance(command, click.Group):
            missing = [
                p.human_readable_name
                for p in command.params
                if p.required and _unset(values.get(p.name))
            ]
            problem = (
                f"unexpected arguments {extra}"
                if extra
                else f"missing {', '.join(missing)}"
                if missing and not asked_help
                else None
            )
            return f"{where}: {problem}" if problem else None
        if not extra:
            given_up = asked_help or "--version" in remaining
            return None if given_up else f"{where}: no command given"
        sub = command.get_command(ctx, extra[0])
        if sub is None:
            return f"{where} has no command {extra[0]!r}"
        ctx = click.Context(sub, info_name=extra[0], parent=ctx)
        command, remaining = sub, extra[1:]


def _convert_values(command: click.Command, ctx: click.Context, values: dict[str, object]) -> None:
    """Convert every given value with its parameter's type (choices, ranges, numbers), the way
    click would; placeholders (`ID`, `NAME`) and paths (the reader's own files) are left."""
    for param in command.get_params(ctx):
        if isinstance(param.type, click.Path | click.File) or not param.name:
            continue
        value = values.get(param.name)
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, str) and not PLACEHOLDER.match(item):
                param.type.convert(item, param, ctx)


def _unset(value: object) -> bool:
    """Not given: None, or click's UNSET sentinel (click 8.2+ parsers return it)."""
    return value is None or type(value).__name__ == "Sentinel"


def _path(ctx: click.Context) -> list[str]:
    names: list[str] = []
    current: click.Context | None = ctx
    while current is not None:
        names.insert(0, current.info_name or "")
        current = current.parent
    return names


def _reference_exists(reference: str) -> bool:
    file, _, test = reference.partition("::")
    path = REPO / file
    if not path.is_file():
        return False
    return not test or f"def {test}(" in path.read_text(encoding="utf-8")


def check_command(command: Command) -> str | None:
    """None if the command is checked, exercised or harmless, else the problem."""
    words = _strip_assignments(list(command.words)) or ["true"]  # assignments only
    if command.error:
        return command.error
    program = words[0].removeprefix(VENV_BIN)
    missing = [
        w
        for w in words[1:]
        if w.startswith(REPO_DIRS)
        and not PLACEHOLDER.match(w)
        and not (REPO / w.split(":", 1)[0]).exists()
    ]
    if missing:
        return f"{missing[0]} does not exist in the repository"
    if program in BUILTINS:
        return None
    if program == "sasflow":
        return check_sasflow(words[1:])
    return _check_other(program, words)


def _check_other(program: str, words: list[str]) -> str | None:
    """A repository module, a repository file, or an allowlisted program."""
    if program in PYTHON and len(words) > 2 and words[1] == "-m" and _repo_module(words[2]):
        return _check_module_options(words[2], words[3:])
    target = _repository_file(program, words)
    if target is not None:
        return None if (REPO / target).is_file() else f"{target!r} is not a file of the repo"
    return _check_allowlisted(program, words)


def _repo_module(module: str) -> Path | None:
    """The file `python -m MODULE` runs, if MODULE is this repository's (not an installed one)."""
    base = REPO.joinpath(*module.split("."))
    for candidate in (base / "__main__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _module_help(module: str) -> str:
    # The module is a file of this repository (checked by _repo_module), run with --help only.
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-m", module, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout if done.returncode == 0 else ""


def _check_module_options(module: str, args: list[str]) -> str | None:
    """Every `--option` given to a repository module appears in its own `--help`."""
    shown = _module_help(module)
    if not shown:
        return f"`python -m {module} --help` failed"
    unknown = [
        a.split("=", 1)[0]
        for a in args
        if a.startswith("--") and not re.search(rf"{re.escape(a.split('=', 1)[0])}\b", shown)
    ]
    return f"`python -m {module}` has no option {unknown[0]}" if unknown else None


def _repository_file(program: str, words: list[str]) -> str | None:
    """The repository file a command runs (`./scripts/demo`, `python bench/run.py`,
    `. scripts/services.sh`), or None if it runs a program."""
    if program in SOURCE or (program in PYTHON and len(words) > 1 and words[1].endswith(".py")):
        return words[1] if len(words) > 1 else ""
    return program if "/" in program else None


def _check_allowlisted(program: str, words: list[str]) -> str | None:
    for key in (" ".join(words[:3]), " ".join([program, *words[1:2]]), program):
        if key in ALLOWLIST:
            reference = ALLOWLIST[key]
            if _reference_exists(reference):
                return None
            return f"allowlisted `{key}` names {reference}, which does not exist"
    return f"`{program}` is neither sasflow, a repository file nor on the ALLOWLIST of {__file__}"


def check_block_marker(block: Block) -> str | None:
    """None if the block's marker (if any) still holds, else the problem."""
    if block.marker is None:
        return None
    kind, value = block.marker
    if kind == "excerpt":
        source = REPO / value
        if not source.is_file():
            return f"excerpt of {value}, which does not exist"
        excerpt = block.text.strip() in source.read_text(encoding="utf-8")
        return None if excerpt else f"no longer a verbatim excerpt of {value}"
    name = value.split("/", 1)[0]
    if name not in DOC_RUNS:
        return f"doc-run {name!r} is not in DOC_RUNS (which test runs it?)"
    if not _reference_exists(DOC_RUNS[name]):
        return f"doc-run {name!r} names {DOC_RUNS[name]}, which does not exist"
    return None


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCED.sub("", path.read_text(encoding="utf-8"))
    return {_slug(m["title"]) for m in HEADING.finditer(text)}


def link_problems(path: Path) -> Iterator[str]:
    """Relative links (and their #anchors) that lead nowhere."""
    text = INLINE_CODE.sub("", FENCED.sub("", path.read_text(encoding="utf-8")))
    for match in LINK.finditer(text):
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            where = resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved
            if str(where) in PENDING:
                print(
                    f"note: {path.name} links to {where}, expected from {PENDING[str(where)]}",
                    file=sys.stderr,
                )
                continue
            yield f"link to {target}: no such file"
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            yield f"link to {target}: no heading #{anchor} there"


def problems() -> Iterator[str]:
    seen_runs: set[str] = set()
    for path in doc_files():
        shown = path.relative_to(REPO)
        for broken in link_problems(path):
            yield f"{shown}: {broken}"
        for block in blocks(path):
            problem = check_block_marker(block)
            if problem:
                yield f"{shown}:{block.line}: {problem}"
            if block.marker and block.marker[0] == "doc-run":
                seen_runs.add(block.marker[1].split("/", 1)[0])
            if block.language not in SHELL_LANGUAGES:
                continue
            for command in commands(block):
                problem = check_command(command)
                if problem:
                    yield f"{shown}:{command.line}: {command.text}\n    {problem}"
    yield from deploy_problems()
    for name in sorted(set(DOC_RUNS) - seen_runs):
        yield f"DOC_RUNS lists {name!r} but no block is marked <!-- doc-run: {name} -->"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--command",
        action="append",
        default=[],
        metavar="LINE",
        help="check these command lines instead of the docs (repeatable); "
        "prints `ok` or the problem for each",
    )
    parser.add_argument(
        "--links", type=Path, metavar="PAGE", help="check only the links of this Markdown page"
    )
    args = parser.parse_args(argv)
    if args.links:
        broken = list(link_problems(args.links.resolve()))
        print("\n".join(broken) or "ok")
        return 1 if broken else 0
    if args.command:
        failed = 0
        for line in args.command:
            block = Block(Path("<command line>"), 1, "sh", line + "\n", None)
            found_here = [p for c in commands(block) if (p := check_command(c))]
            failed += bool(found_here)
            print(f"{line}\t{'; '.join(found_here) or 'ok'}")
        return 1 if failed else 0
    found = list(problems())
    for problem in found:
        print(problem)
    checked = sum(
        1
        for p in doc_files()
        for b in blocks(p)
        if b.language in SHELL_LANGUAGES
        for _ in commands(b)
    )
    print(
        f"{checked} commands in {len(doc_files())} files: "
        f"{'ok' if not found else f'{len(found)} problem(s)'}",
        file=sys.stderr,
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
