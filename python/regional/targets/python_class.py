"""``target=python:<module>:<Class>``: any class with ``prepare``, ``commit`` and ``abort``.

The module must be importable by the driver and by every Python worker. The class is built with
the sink's options (a dict, keys lower-cased, plus ``queryid``). See ``regional.targets.base``.
"""

from __future__ import annotations

import importlib
from typing import Any

from regional.errors import RegionalConfigError
from regional.targets.base import Target, check_target


def load_python_class(spec: str, options: dict[str, Any]) -> Target:
    parts = spec.split(":")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise RegionalConfigError(f"target {spec!r} must have the form python:<module>:<Class>")
    _, module_name, class_name = parts
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RegionalConfigError(
            f"target {spec!r}: cannot import module {module_name!r} ({exc}); "
            "it must be importable by the driver and by every Python worker (check PYTHONPATH)"
        ) from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise RegionalConfigError(f"target {spec!r}: module {module_name!r} has no class {class_name!r}")
    return check_target(spec, cls(options))
