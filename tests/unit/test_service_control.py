"""Tests never stop, restart or reconfigure a service they did not start.

A test that restarts a server does it to a throw-away instance on free ports
(`tests/private_services.py` over `tests/chaos/instances.py`): a restart of the machine's
PostgreSQL or RabbitMQ ends every session of everyone using them. Read from the source: only
the instance helpers name a program that controls a server, and there only with the
instance's own data directory (`pg_ctl -D`, `initdb -D`), node (`rabbitmqctl -n`) or
environment (`rabbitmq-server`, whose node name is in its environment). Elsewhere
`rabbitmqctl` may manage what a test created (users, virtual hosts, queues) but never the node
(`stop_app`, `reset`, `set_disk_free_limit`, ...), and no SQL reconfigures the server
(`ALTER SYSTEM`, `pg_reload_conf()`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "bench")
CONTROLLERS = frozenset({"tests/chaos/instances.py"})
"""The only modules that run server-control programs: on the instances they started."""
SELF = "tests/unit/test_service_control.py"

PRIVATE_TARGET = {"pg_ctl": "-D", "initdb": "-D", "rabbitmqctl": "-n", "rabbitmq-server": "env="}
"""How a controller names its own instance to each program it may run."""
SERVER_PROGRAMS = frozenset(
    {
        *PRIVATE_TARGET,
        "pg_ctlcluster",
        "pg_createcluster",
        "pg_dropcluster",
        "systemctl",
        "service",
        "invoke-rc.d",
        "rabbitmq-plugins",
    }
)
"""Programs that start, stop or reconfigure a server; `rabbitmqctl` outside a controller only
with a verb that leaves the node alone."""
NODE_VERBS = frozenset(
    {
        "stop_app",
        "start_app",
        "stop",
        "shutdown",
        "reset",
        "force_reset",
        "force_boot",
        "eval",
        "set_disk_free_limit",
        "set_vm_memory_high_watermark",
        "set_log_level",
        "close_all_connections",
        "enable_feature_flag",
        "join_cluster",
        "forget_cluster_node",
        "rotate_logs",
    }
)
"""`rabbitmqctl` commands that stop, restart or reconfigure the node itself."""
SERVICE_ACTIONS = frozenset({"start", "stop", "restart", "reload", "force-reload"})
SERVER_SQL = ("alter system", "pg_reload_conf(")


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _strings(tree: ast.AST) -> Iterator[str]:
    """Every string literal of the module but its docstrings (f-strings' literal parts too)."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.value


def _program(text: str) -> str | None:
    """The server-control program a string runs or names (`/usr/bin/pg_ctl`, `pg_ctlcluster
    15 main restart`), if any."""
    words = text.split()
    if not words:
        return None
    name = PurePosixPath(words[0]).name
    if name == "service" and len(words) > 1 and not set(words[2:3]) & SERVICE_ACTIONS:
        # Prose ("service unavailable"), unless it reads `service <name> restart`.
        return None
    return name if name in SERVER_PROGRAMS else None


def _argv_words(item: ast.expr) -> Iterator[str]:
    """The strings a command line's item is built of: `"pg_ctl"`, `f"{bin}/pg_ctl"`,
    `str(bin / "pg_ctl")`, `shutil.which("rabbitmqctl")`."""
    if isinstance(item, ast.Constant) and isinstance(item.value, str):
        yield item.value
    elif isinstance(item, ast.JoinedStr):
        for part in item.values:
            yield from _argv_words(part)
    elif isinstance(item, ast.BinOp):
        yield from _argv_words(item.left)
        yield from _argv_words(item.right)
    elif isinstance(item, ast.Call) and (
        (isinstance(item.func, ast.Name) and item.func.id == "str")
        or (isinstance(item.func, ast.Attribute) and item.func.attr in {"which", "fspath"})
    ):
        for arg in item.args:
            yield from _argv_words(arg)


@dataclass(frozen=True)
class CommandLine:
    """A call's arguments (a list argument's items spliced in) or a list not passed to a call,
    with the call's keyword names; or the value of an assignment."""

    items: list[ast.expr]
    keywords: frozenset[str]

    def words(self) -> set[str]:
        return {word for item in self.items for word in _argv_words(item)}

    def programs(self) -> set[str]:
        return {program for word in self.words() if (program := _program(word))}

    def verbs(self) -> set[str]:
        """The node verbs run by a line that starts with a program (`[ctl, "stop_app"]`), not
        with the verb itself (`instance.ctl("stop_app")`, `procs.run("stop")`)."""
        first = self.items[0] if self.items else None
        if first is None or (
            isinstance(first, ast.Constant) and _program(str(first.value)) != "rabbitmqctl"
        ):
            return set()
        return {word for item in self.items[1:] for word in _argv_words(item) if word in NODE_VERBS}


def _command_lines(tree: ast.AST, *, outermost: bool) -> list[CommandLine]:
    """The module's command lines; with `outermost`, only those not inside another's arguments
    (`str(bin / "pg_ctl")` is part of the call it is passed to) and no assignments."""
    lines: list[tuple[ast.AST, CommandLine]] = []
    passed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            items: list[ast.expr] = []
            for arg in node.args:
                if isinstance(arg, ast.List | ast.Tuple):
                    passed.add(id(arg))
                    items.extend(arg.elts)
                else:
                    items.append(arg)
            named = frozenset(k.arg for k in node.keywords if k.arg is not None)
            lines.append((node, CommandLine(items, named)))
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value and not outermost:
            lines.append((node, CommandLine([node.value], frozenset())))
    lines.extend(
        (node, CommandLine(list(node.elts), frozenset()))
        for node in ast.walk(tree)
        if isinstance(node, ast.List | ast.Tuple) and id(node) not in passed
    )
    if not outermost:
        return [line for _, line in lines]
    inner = {
        id(part)
        for _, line in lines
        for item in line.items
        for part in ast.walk(item)
        if isinstance(part, ast.Call | ast.List | ast.Tuple)
    }
    return [line for node, line in lines if id(node) not in inner]


def _controller_violations(tree: ast.AST) -> list[str]:
    found: list[str] = []
    for line in _command_lines(tree, outermost=True):
        for program in sorted(line.programs()):
            target = PRIVATE_TARGET.get(program)
            if target is None:
                found.append(f"{program} runs on no instance of the suite's own")
            elif target == "env=":
                if "env" not in line.keywords:
                    found.append(f"{program} without the instance's environment")
            elif target not in line.words():
                found.append(f"{program} without {target}")
    return found


def violations(source: str, *, controller: bool) -> list[str]:
    """What in `source` controls a server it should not: a program outside a controller, a
    node verb next to `rabbitmqctl`, server-wide SQL; in a controller, a program run without
    its instance's data directory, node or environment."""
    tree = ast.parse(source)
    if controller:
        return _controller_violations(tree)
    lines = _command_lines(tree, outermost=False)
    programs = {program for line in lines for program in line.programs()}
    found = [f"runs {program}" for program in sorted(programs - {"rabbitmqctl"})]
    if "rabbitmqctl" in programs:
        verbs = {verb for line in lines for verb in line.verbs()}
        verbs |= {
            words[1]
            for line in lines
            for text in line.words()
            if _program(text) == "rabbitmqctl"
            and len(words := text.split()) > 1
            and words[1] in NODE_VERBS
        }
        found.extend(f"rabbitmqctl {verb}" for verb in sorted(verbs))
    found.extend(
        f"server-wide SQL {text.strip()[:60]!r}"
        for text in _strings(tree)
        if any(statement in text.lower() for statement in SERVER_SQL)
    )
    return found


def _modules() -> Iterator[str]:
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*.py")):
            yield path.relative_to(REPO).as_posix()


def test_only_the_instance_helpers_control_a_server_and_only_their_own() -> None:
    found = {
        module: problems
        for module in _modules()
        if module != SELF
        and (problems := violations((REPO / module).read_text(), controller=module in CONTROLLERS))
    }
    assert found == {}, (
        "tests may stop, restart or reconfigure only services they started: use "
        f"tests/private_services.py (throw-away instances on free ports); found {found}"
    )


def test_the_controllers_exist() -> None:
    assert sorted(m for m in CONTROLLERS if (REPO / m).is_file()) == sorted(CONTROLLERS)


RESTARTS_THE_MACHINES = {
    "rabbitmqctl stop_app": """
ctl = shutil.which("rabbitmqctl")
subprocess.run([ctl, "stop_app"], check=True)
""",
    "pg_ctlcluster restart": """
ctl = shutil.which("pg_ctlcluster")
subprocess.run([ctl, "--skip-systemctl-redirect", "15", "main", "restart", "-m", "fast"])
""",
    "a shell line": """
subprocess.run("rabbitmqctl reset", shell=True)
""",
    "systemctl": """
subprocess.run(["systemctl", "restart", "postgresql"])
""",
    "service": """
subprocess.run("service rabbitmq-server stop", shell=True)
""",
    "ALTER SYSTEM": """
conn.execute(text("ALTER SYSTEM SET max_connections = 5"))
""",
    "pg_ctl by its path": """
subprocess.run([f"{bin}/pg_ctl", "restart", "-m", "immediate"])
""",
}


@pytest.mark.parametrize("source", RESTARTS_THE_MACHINES.values(), ids=RESTARTS_THE_MACHINES)
def test_a_test_controlling_the_machines_services_is_caught(source: str) -> None:
    assert violations(source, controller=False) != []


def test_managing_what_a_test_created_is_allowed() -> None:
    source = """
ctl = shutil.which("rabbitmqctl")
subprocess.run([ctl, "-q", "add_user", name, "pw"], check=True)
subprocess.run([ctl, "-q", "delete_vhost", vhost], check=False)
subprocess.run([ctl, "-q", "list_queues", "name"], check=False)
conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s")
procs.run("stop")
own_rabbitmq.ctl("stop_app")
raise TransientError("service unavailable: try again")
"""
    assert violations(source, controller=False) == []


def test_a_controller_must_name_its_own_instance() -> None:
    own = """
self.ctl_base = [str(RABBIT_BIN / "rabbitmqctl"), "-n", self.node]
self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "restart")
_run([str(RABBIT_BIN / "rabbitmq-server"), "-detached"], env=self.env)
"""
    machines = """
_run([str(RABBIT_BIN / "rabbitmqctl"), "stop_app"])
self._as_postgres(str(self.bin / "pg_ctl"), "restart")
_run([str(RABBIT_BIN / "rabbitmq-server"), "-detached"])
_run(["pg_ctlcluster", "15", "main", "restart"])
"""
    assert violations(own, controller=True) == []
    assert violations(machines, controller=True) == [
        "rabbitmqctl without -n",
        "pg_ctl without -D",
        "rabbitmq-server without the instance's environment",
        "pg_ctlcluster runs on no instance of the suite's own",
    ]
