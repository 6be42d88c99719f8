"""What every target implements (``docs/design.md``, "Targets"): a two-phase committer.

``prepare`` runs in a Spark task and stages one region's slice (phase one); everything else runs on the
driver, called by the phase-two coordinator (``regional.coordinator``), its only caller. A re-run after a
crash calls ``commit`` and ``abort`` again with the same arguments: each must act once. Handles are JSON
values: they go into the store's write-ahead intent before anything is published.

Built-in targets are modules of this package named by ``target=<name>``, each exposing
``create(options) -> Target``; ``target=python:<module>:<Class>`` loads any class with ``prepare``,
``commit`` and ``abort`` (``regional.targets.python_class``). Adding a target is adding a module.
A dead-letter sink is a target too (``regional.targets.dead_letter_target``).

The options a target receives are the sink's (keys lower-cased) plus ``queryid``: the query id of the
store, stable for the life of the checkpoint, for idempotency keys.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pyarrow as pa

from regional.errors import RegionalConfigError, RegionalError
from regional.store.model import EpochRecord

QUERY_ID_OPTION = "queryid"

# The ``region`` that ``prepare`` receives in a query whose plan moves rows between tasks (a repartition):
# each task then holds rows of many regions, and epochs are all-or-nothing.
MIXED_REGIONS = "*"

Handle = TypeVar("Handle")  # what a target's prepare returns for one region: a JSON value


class RowsRejected(RegionalError):
    """Raised by a target's ``prepare`` (in the task) when the rows themselves are refused: a CHECK constraint or
    NOT NULL column they break, a value the database will not take. That is the rows' failure, not the
    target's: the sink fails the task with it, as a raising UDF would, so the region is quarantined and, with
    dead letters on, the refused record is isolated and dead-lettered, never published. Raise it only for a refusal
    that repeats on every attempt with the same rows (never for a connection lost or a server down: those are the
    target's failures), and only after removing what this attempt staged.

    An isolated record refused with it is dead-lettered on evidence (docs/design.md, "Poison or outage"): records of
    its region beside it must pass the target's ``probe`` between its failures. Raise ``RowsInvalid`` instead when
    the refusal is certainly about the rows alone."""


class RowsInvalid(RowsRejected):
    """``RowsRejected`` for a refusal that is certainly about the rows alone, whatever else the target holds and
    whenever it is tried: a value the column cannot take, a NOT NULL column or a CHECK constraint (a function of
    the row) it breaks. The target's verdict: an isolated record refused with it is dead-lettered on its first
    failure alone, without waiting for evidence or retries (docs/dead-letters.md, "Your own verdict"). Never for a
    refusal that depends on other rows (a unique or foreign key), on a trigger or policy, or on the server."""


@dataclass(frozen=True)
class EpochReport:
    """Region-level view of one epoch: never a bare "epoch complete"."""

    epoch: int
    kind: str
    committed: dict[str, tuple[int, int]]  # region -> (start, end) offsets published
    fallen_back: dict[str, tuple[int, str]]  # region -> (ref_epoch, reason)
    rows: dict[str, int] = field(default_factory=dict)  # region -> rows published

    @classmethod
    def of(cls, record: EpochRecord) -> EpochReport:
        return cls(
            epoch=record.epoch,
            kind=record.kind.value,
            committed={r: (s.start, s.end) for r, s in record.committed.items()},
            fallen_back={r: (f.ref_epoch, f.reason) for r, f in record.fallen_back.items()},
            rows={r: s.rows for r, s in record.committed.items()},
        )


class Target(ABC, Generic[Handle]):
    """A two-phase committer of region slices. Subclass it, implement ``prepare``, ``commit`` and
    ``abort``; the other methods have defaults that do nothing, and say when to override them."""

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        self.options = dict(options or {})

    # -- phase one, in a Spark task ------------------------------------------------------------

    @abstractmethod
    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Handle:
        """In the task of one region: stage its slice of ``epoch`` and return a handle naming what was
        staged. Raising fails only this region (it falls back). It must take every batch."""

    def probe(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Handle | None:
        """In the task of a probe (records of ``region`` beside its isolated record, ``docs/design.md``, "Poison or
        outage"): whether the target takes these rows, which are never published and may be published already
        (the records before the suspect). Raise ``RowsRejected`` if it refuses them; return a handle to discard
        (``abort``), or None. Default: ``prepare``, discarded after the decision. Override it when staging rows
        already published fails (a unique key) or costs too much: check the rows without keeping them."""
        return self.prepare(epoch, region, batches)

    # -- phase two, on the driver --------------------------------------------------------------

    @abstractmethod
    def commit(self, epoch: int, handles: dict[str, Handle], report: EpochReport | None = None) -> None:
        """Publish the staged slices ``handles`` (region -> handle) of ``epoch``, atomically. ``report`` says
        what the epoch did region by region (None for a dead-letter sink's epoch). Called again with the same
        arguments after a crash: publish nothing twice."""

    @abstractmethod
    def abort(self, epoch: int, handles: dict[str, Handle]) -> None:
        """Discard staged slices that will never be published. Called again after a crash: harmless."""

    def open(self, schema: pa.Schema) -> None:
        """Before each epoch's tasks run, with the Arrow schema ``prepare`` will receive: check the target and
        create what is missing, so that a bad target fails at start, not in a task. Default: nothing."""

    def task_options(self) -> dict[str, str]:
        """On the driver, after ``open``: options the tasks' copies of this target need from what ``open`` found
        (the Delta table's partition columns); they are added to the options the tasks build it from. Default:
        none."""
        return {}

    def sweep(self, up_to_epoch: int) -> None:
        """Remove what recorded epochs up to ``up_to_epoch`` staged but never published (dead tasks and
        drivers leave such output). Called at start and every few epochs. Default: nothing to remove."""

    def published(self, epoch: int) -> bool:
        """Whether the target already holds ``epoch``'s commit: lets the driver notice a store that lost an
        intent. Default: False (cannot tell)."""
        return False

    def on_epoch(self, epoch: int, committed: dict[str, tuple[int, int]],
                 fallen_back: dict[str, tuple[int, str]]) -> None:
        """After each recorded epoch: the region-level notification (FLIP-600's partially completed
        checkpoint), ``committed={region: (start, end)}``, ``fallen_back={region: (ref_epoch, reason)}``.
        At least once. Default: nothing."""

    def location(self) -> str | None:
        """Where the target keeps its data, when it is a path (so that dead letters are never sent into the
        target itself). Default: None."""
        return None


class RegionalTarget(Target[Any]):
    """The base class user targets had before ``Target`` was abstract, kept for them: its methods raise
    NotImplementedError until overridden, as they did, so a subclass that never aborts still builds."""

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


def chain_first(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``first`` followed by ``rest``: puts back a batch taken to look at it."""
    yield first
    yield from rest


_EXCEPTION_CLASS = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout))\b")


def reason_class(reason: str) -> str:
    """What a target may keep of why a region fell back, where readers of its data see it (a table's history):
    how it fell back and the exception's class, never the message, which often quotes the record (a pipeline that
    keeps bad records out of a table on purpose must not leak them into its history). ``status`` keeps it all."""
    kind = ("quarantined" if reason.startswith("quarantined") or "failed alone" in reason
            else "aborted" if reason.startswith("epoch aborted") else "failed")
    found = _EXCEPTION_CLASS.search(reason)
    return f"{kind}: {found.group(1)}" if found else kind
