"""Load the user's registry from `--app MODULE[:ATTRIBUTE]` (like `celery -A`)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from sasflow.errors import AppLoadError
from sasflow.registry import Registry

DEFAULT_ATTRIBUTE = "registry"


def load_object(spec: str, default_attribute: str = DEFAULT_ATTRIBUTE) -> object:
    """Import `module[:attribute]` and return the attribute."""
    module_name, _, attribute = spec.partition(":")
    attribute = attribute or default_attribute
    if not module_name:
        raise AppLoadError(f"invalid app {spec!r}: expected MODULE or MODULE:ATTRIBUTE")
    # Like `celery -A`: an app module in the current directory is importable.
    cwd = str(Path.cwd())
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppLoadError(f"cannot import app module {module_name!r}: {exc}") from exc
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise AppLoadError(f"app module {module_name!r} has no attribute {attribute!r}") from None
    return target


def load_registry(spec: str) -> Registry:
    """The Registry that `module[:attribute]` names (or that the callable it names builds).

    The attribute defaults to `registry`.
    """
    target = load_object(spec)
    if callable(target) and not isinstance(target, Registry):
        target = target()
    if not isinstance(target, Registry):
        raise AppLoadError(f"{spec} is a {type(target).__name__}, expected a sasflow.Registry")
    return target
