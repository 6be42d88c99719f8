"""``target=python:<module>:<Class>``: any class with ``prepare``, ``commit`` and ``abort``.

The module must be importable by the driver and by every Python worker. The class is built with the sink's
options (a dict, keys lower-cased, plus ``queryid``). A subclass of ``regional.Target`` is used as it is.
Any other class is wrapped in ``DuckTarget``, which calls its ``commit(epoch, handles)`` and whichever of
``Target``'s optional methods it has: this module is the one place that looks a user's class up by name.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from regional.errors import RegionalConfigError
from regional.targets.base import EpochReport, Target

REQUIRED = ("prepare", "commit", "abort")
OPTIONAL = ("open", "sweep", "published", "on_epoch", "location", "probe")


def load(spec: str, options: dict[str, str]) -> Target[Any]:
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
    factory = getattr(module, class_name, None)  # a class, or any callable that builds the target
    if not callable(factory):
        raise RegionalConfigError(f"target {spec!r}: module {module_name!r} has no class {class_name!r}")
    return as_target(spec, factory(options), options)


def as_target(spec: str, instance: Any, options: dict[str, str]) -> Target[Any]:
    """``instance`` as a ``Target``: itself when it subclasses ``Target`` with the documented ``commit(epoch,
    handles, report)``; otherwise wrapped, so that its ``commit`` is called as it was written."""
    if isinstance(instance, Target) and _takes_report(instance.commit):
        return instance
    return DuckTarget(spec, instance, options)


def _takes_report(commit: Callable[..., Any]) -> bool:
    try:
        inspect.signature(commit).bind(0, {}, report=None)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): take the documented one
        pass
    return True


class DuckTarget(Target[Any]):
    """A user's class that does not subclass ``regional.Target``, as a ``Target``."""

    def __init__(self, spec: str, inner: Any, options: dict[str, str]) -> None:
        super().__init__(options)
        methods = {name: getattr(inner, name, None) for name in (*REQUIRED, *OPTIONAL)}
        missing = [name for name in REQUIRED if not callable(methods[name])]
        if missing:
            raise RegionalConfigError(f"target {spec!r}: {type(inner).__name__} lacks method(s) {', '.join(missing)}")
        self.inner = inner
        self._optional: dict[str, Callable[..., Any]] = {n: m for n in OPTIONAL if callable(m := methods[n])}
        # A plain class that asks for the epoch's report gets it, as the old contract (``wants_report``) said.
        self.wants_report = bool(getattr(inner, "wants_report", False))

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any:
        return self.inner.prepare(epoch, region, batches)

    def probe(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any:
        if "probe" in self._optional:
            return self._optional["probe"](epoch, region, batches)
        return self.inner.prepare(epoch, region, batches)

    def commit(self, epoch: int, handles: dict[str, Any], report: EpochReport | None = None) -> None:
        if self.wants_report:
            self.inner.commit(epoch, handles, report=report)
        else:
            self.inner.commit(epoch, handles)  # the documented signature of a plain class: no report

    def abort(self, epoch: int, handles: dict[str, Any]) -> None:
        self.inner.abort(epoch, handles)

    def open(self, schema: pa.Schema) -> None:
        if "open" in self._optional:
            self._optional["open"](schema)

    def sweep(self, up_to_epoch: int) -> None:
        if "sweep" in self._optional:
            self._optional["sweep"](up_to_epoch)

    def published(self, epoch: int) -> bool:
        return bool(self._optional["published"](epoch)) if "published" in self._optional else False

    def on_epoch(self, epoch: int, committed: dict[str, tuple[int, int]],
                 fallen_back: dict[str, tuple[int, str]]) -> None:
        if "on_epoch" in self._optional:
            self._optional["on_epoch"](epoch, committed, fallen_back)

    def location(self) -> str | None:
        return self._optional["location"]() if "location" in self._optional else None

