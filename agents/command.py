"""The built-in `command` agent and workflow: run a program as a task, no Python to write.

    sasflow agent --builtin command                 # serves the agent `command`, action `run`
    sasflow --app sasflow.agents.command scheduler  # knows the workflow `command`
    sasflow submit command '{"argv": ["pg_dump", "-f", "/backups/db.sql", "shop"]}'

The step's input is `{"argv": [...], "env": {...}, "cwd": "..."}`: `argv` a non-empty list of
strings, run without a shell (`Call.run`: its own process group, killed at the deadline);
`env` (optional) strings added to the agent's environment; `cwd` (optional) the working
directory. Exit code 0 replies `ok` with `{"exit_code", "stdout", "stderr", "seconds",
"truncated"}` (the last DEFAULT_TAIL_BYTES of each stream); another exit code replies `error`
with the code and the tails in the message; a program still running at the deadline is killed
and the agent stays silent (the protocol's rule: the supervisor counts the expiry).
"""

from __future__ import annotations

from typing import Any

from sasflow.agents.agent import Agent, Call
from sasflow.agents.errors import PermanentError
from sasflow.policy import StepPolicy
from sasflow.registry import Registry
from sasflow.workflow import Step, Workflow

NAME = "command"
ACTION = "run"
DEFAULT_TIMEOUT = 3600.0
"""Seconds the workflow's step gives a program (the workflow `command`)."""
MESSAGE_TAIL = 1500
"""Characters of each output tail quoted in an error reply's message."""


class CommandFailedError(PermanentError):
    """The program exited with a non-zero code."""


def command_input(value: Any) -> tuple[list[str], dict[str, str] | None, str | None]:
    """Validate a step's input: (argv, env, cwd); PermanentError says what is wrong."""
    if not isinstance(value, dict):
        raise PermanentError(f"input must be an object with 'argv', got {type(value).__name__}")
    unknown = sorted(set(value) - {"argv", "env", "cwd"})
    if unknown:
        raise PermanentError(f"input has unknown field(s) {unknown}: expected argv, env, cwd")
    argv = value.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise PermanentError("input 'argv' must be a non-empty list of strings (no shell)")
    if any("\x00" in a for a in argv):
        raise PermanentError("input 'argv' must not contain NUL characters")
    env = value.get("env")
    if env is not None and not (
        isinstance(env, dict) and all(isinstance(v, str) for v in env.values())
    ):
        raise PermanentError("input 'env' must be an object of strings")
    cwd = value.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise PermanentError("input 'cwd' must be a string")
    return argv, env, cwd


def run_command(call: Call) -> dict[str, Any]:
    """The handler of action `run`."""
    argv, env, cwd = command_input(call.input)
    try:
        done = call.run(argv, env=env, cwd=cwd)
    except OSError as exc:  # no such program or directory, not executable...
        raise PermanentError(f"cannot start {argv[0]!r}: {exc}") from exc
    output = {
        "exit_code": done.returncode,
        "stdout": done.stdout,
        "stderr": done.stderr,
        "seconds": round(done.seconds, 3),
        "truncated": done.truncated,
    }
    if done.returncode != 0:
        raise CommandFailedError(
            f"{argv[0]} exited with code {done.returncode}; "
            f"stderr: {done.stderr[-MESSAGE_TAIL:]!r}; stdout: {done.stdout[-MESSAGE_TAIL:]!r}"
        )
    return output


def make_agent() -> Agent:
    """A fresh `command` agent (its handler takes no configuration)."""
    made = Agent(NAME)
    made.add_handler(ACTION, run_command)
    return made


def make_workflow(*, timeout: float = DEFAULT_TIMEOUT, version: int = 1) -> Workflow:
    """The one-step workflow `command`. A program that timed out is not run again by default
    (max_failures 1: an arbitrary program need not be idempotent): the step goes to error."""
    return Workflow(
        NAME,
        [
            Step(
                ACTION,
                agent=NAME,
                action=ACTION,
                policy=StepPolicy(timeout=timeout, max_failures=1),
            )
        ],
        version=version,
    )


agent = make_agent()
"""`sasflow agent --builtin command` serves this."""
workflow = make_workflow()
registry = Registry([workflow], [agent])
"""`--app sasflow.agents.command`: the workflow and agent alone; an app adds both to its own."""
