"""The interface every target implements (DESIGN.md section 3, targets), and how one is found.

A target is a two-phase committer. ``prepare`` runs in a Spark task and stages one region's slice;
``commit`` and ``abort`` run on the driver. A re-run after a crash calls ``commit`` and ``abort``
again with the same arguments: each must act once. Handles are JSON values: they go into the
store's write-ahead intent.

Built-in targets are modules of this package named by ``target=<name>``, each exposing
``create(options) -> Target``; ``target=python:<module>:<Class>`` loads any class with the methods
below. Adding a target is adding a module: nothing else changes.

The options a target receives are the sink's (keys lower-cased) plus ``queryid``: the query id of
the store, stable for the life of the checkpoint, for idempotency keys.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from regional.errors import RegionalConfigError
from regional.plugins import find_plugin

QUERY_ID_OPTION = "queryid"

# The ``region`` that ``prepare`` receives in a query whose plan moves rows between tasks (a repartition):
# each task then holds rows of many regions, and epochs are all-or-nothing.
MIXED_REGIONS = "*"


@dataclass(frozen=True)
class EpochReport:
    """Region-level view of one epoch: never a bare "epoch complete"."""

    epoch: int
    kind: str
    committed: dict[str, tuple[int, int]]  # region -> (start, end) offsets published
    fallen_back: dict[str, tuple[int, str]]  # region -> (ref_epoch, reason)
    rows: dict[str, int] = field(default_factory=dict)  # region -> rows published


@runtime_checkable
class Target(Protocol):
    """Required methods. Optional ones, used when present:

    - ``on_epoch(epoch, committed, fallen_back)``: the region-level notification after each recorded epoch;
    - ``published(epoch) -> bool``: whether the target already holds epoch's commit (lets the driver notice
      a store that lost an intent);
    - ``sweep(up_to_epoch)``: remove staged output of epochs up to this one that was never published;
    - ``wants_report = True``: ``commit`` then also receives ``report=EpochReport(...)``;
    - ``open(schema)``: on the driver before each epoch's tasks run, with the Arrow schema ``prepare`` will
      receive: check the target and create what is missing, so a bad target fails at start.
    """

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any: ...

    def commit(self, epoch: int, handles: dict[str, Any]) -> None: ...

    def abort(self, epoch: int, handles: dict[str, Any]) -> None: ...


class RegionalTarget:
    """Optional base class. A subclass's ``commit`` also receives the epoch's region-level report."""

    wants_report = True

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any:
        raise NotImplementedError

    def commit(self, epoch: int, handles: dict[str, Any], report: EpochReport | None = None) -> None:
        raise NotImplementedError

    def abort(self, epoch: int, handles: dict[str, Any]) -> None:
        raise NotImplementedError



def require_query_id(target: str, options: Mapping[str, str]) -> str:
    """The store's query id, which the regional sink adds to a target's options."""
    query_id = options.get(QUERY_ID_OPTION)
    if not query_id:
        raise RegionalConfigError(f"target={target} needs the query id of the regional store (internal option "
                                  f"{QUERY_ID_OPTION!r}); build it through the regional sink")
    return query_id


def load_target(options: Mapping[str, str]) -> Target:
    """Build the target named by the sink's ``target`` option."""
    name = options.get("target")
    if not name:
        raise RegionalConfigError(
            "the regional sink needs a target: add .option('target', 'delta') "
            "or .option('target', 'python:<module>:<Class>') to writeStream"
        )
    if name.startswith("python:"):
        from regional.targets.python_class import load_python_class

        return load_python_class(name, dict(options))
    module = find_plugin("regional.targets", name)
    if module is None:
        raise RegionalConfigError(f"unknown target {name!r}: use target=delta or target=python:<module>:<Class>")
    return check_target(name, module.create(dict(options)))


def check_target(name: str, target: Any) -> Target:
    missing = [m for m in ("prepare", "commit", "abort") if not callable(getattr(target, m, None))]
    if missing:
        raise RegionalConfigError(f"target {name!r}: {type(target).__name__} lacks method(s) {', '.join(missing)}")
    return target


def commit_with_report(target: Target, epoch: int, handles: dict[str, Any], report: EpochReport) -> None:
    if getattr(target, "wants_report", False):
        target.commit(epoch, handles, report=report)  # type: ignore[call-arg]
    else:
        target.commit(epoch, handles)


def chain_first(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``first`` followed by ``rest``: puts back a batch taken to look at it."""
    yield first
    yield from rest
