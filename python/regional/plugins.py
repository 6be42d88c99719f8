"""Sources and targets are modules found by name: adding one is adding a module, nothing else."""

from __future__ import annotations

import importlib
import re
from types import ModuleType

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def find_plugin(package: str, name: str) -> ModuleType | None:
    """``<package>.<name>`` if it exists and has a ``create`` function; None for anything else (a name
    that is not a plain identifier never reaches the import system)."""
    if not _NAME.match(name) or name == "base":
        return None
    try:
        module = importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.{name}":
            raise  # the plugin exists but one of its own imports is missing: say so
        return None
    return module if callable(getattr(module, "create", None)) else None
