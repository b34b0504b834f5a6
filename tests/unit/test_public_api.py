"""The public API is exactly what `sasflow` and `sasflow.agents` export: adding or removing a
name is a deliberate change of this list (and of the CHANGELOG)."""

from __future__ import annotations

import re
from pathlib import Path

import sasflow
import sasflow.agents
import sasflow.client

PUBLIC = {
    "AppLoadError",
    "BacklogFullError",
    "Backoff",
    "BreakerPolicy",
    "BrokerUnavailableError",
    "CatchUp",
    "ConfigurationError",
    "Default",
    "DefinitionError",
    "ExternalAgent",
    "FieldSpec",
    "InvalidInputError",
    "InvalidMessageError",
    "InvalidScheduleError",
    "PublishError",
    "Registry",
    "RetryPolicy",
    "SasflowError",
    "Schedule",
    "Settings",
    "Step",
    "StepContext",
    "StepPolicy",
    "StoreUnavailableError",
    "SubmitResult",
    "UnknownWorkflowError",
    "Workflow",
    "submit_run",
    "wait_for_room",
}

AGENTS_PUBLIC = {
    "Agent",
    "BreakerOpenError",
    "Call",
    "ChildKilledError",
    "Completed",
    "Defer",
    "PermanentError",
    "TransientError",
    "TransientHttp",
}

CLIENT_PUBLIC = {
    "ApiError",
    "Client",
    "Page",
    "StreamFilter",
    "StreamUpdate",
    "Subscription",
    "submit_run",
    "wait_for_room",
}
"""`sasflow.client`: the HTTP SDK, and `submit_run` and `wait_for_room` (also exported by
`sasflow`)."""


def test_sasflow_exports_exactly_the_public_names() -> None:
    assert set(sasflow.__all__) == PUBLIC


def test_every_public_name_resolves_including_the_lazy_ones() -> None:
    missing = [name for name in sorted(PUBLIC) if getattr(sasflow, name, None) is None]
    assert missing == []


def test_an_unknown_name_is_an_attribute_error() -> None:
    assert not hasattr(sasflow, "no_such_name")


def test_sasflow_agents_exports_exactly_its_public_names() -> None:
    assert set(sasflow.agents.__all__) == AGENTS_PUBLIC
    assert [name for name in sorted(AGENTS_PUBLIC) if not hasattr(sasflow.agents, name)] == []


def test_sasflow_client_exports_exactly_its_public_names() -> None:
    assert set(sasflow.client.__all__) == CLIENT_PUBLIC
    assert [name for name in sorted(CLIENT_PUBLIC) if not hasattr(sasflow.client, name)] == []
    assert sasflow.client.submit_run is sasflow.submit_run


ALLOWED_IN_EXAMPLES = {"sasflow", "sasflow.agents", "sasflow.client", "sasflow.when"}
"""What examples and docs import: the public packages (`sasflow.when`, the conditions of steps,
is public as a module: its `Any` and `All` would shadow common names at the top level); and the
demo's own package, whose scenario the orders example drives (`sasflow.demo.*`)."""

IMPORT = re.compile(r"^\s*(?:from|import)\s+(sasflow[\w.]*)", re.MULTILINE)


def _example_imports() -> list[tuple[str, str]]:
    repo = Path(__file__).resolve().parents[2]
    sources = [(p, p.read_text(encoding="utf-8")) for p in (repo / "examples").rglob("*.py")]
    for doc in [repo / "README.md", *(repo / "docs").rglob("*.md")]:
        blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.DOTALL)
        sources += [(doc, block) for block in blocks]
    return [
        (path.relative_to(repo).as_posix(), match[1])
        for path, text in sources
        for match in IMPORT.finditer(text)
    ]


def test_examples_and_docs_use_only_public_names() -> None:
    imports = _example_imports()
    assert len({path for path, _ in imports}) > 5  # the scan reads the examples and the docs
    internal = [
        (path, module)
        for path, module in imports
        if module not in ALLOWED_IN_EXAMPLES and not module.startswith("sasflow.demo.")
    ]
    assert internal == []
