"""Targets: the two-phase committers behind the sink (DESIGN.md section 3).

``prepare`` runs in a task and stages one region's slice; ``commit`` and
``abort`` run on the driver. ``target=delta`` is built in;
``target=python:<module>:<Class>`` loads any class with the same methods.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.parquet as pq

from regional.errors import RegionalConfigError
from regional.ids import encode_region


@dataclass(frozen=True)
class EpochReport:
    """Region-level view of one epoch: never a bare "epoch complete"."""

    epoch: int
    kind: str
    committed: dict[str, tuple[int, int]]  # region -> (start, end) offsets published
    fallen_back: dict[str, tuple[int, str]]  # region -> (ref_epoch, reason)
    rows: dict[str, int] = field(default_factory=dict)  # region -> rows published


# The ``region`` that ``prepare`` receives in a query whose plan moves rows between tasks (a repartition):
# each task then holds rows of many regions, and epochs are all-or-nothing.
MIXED_REGIONS = "*"


@runtime_checkable
class Committer(Protocol):
    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any: ...

    def commit(self, epoch: int, handles: dict[str, Any]) -> None: ...

    def abort(self, epoch: int, handles: dict[str, Any]) -> None: ...


class RegionalCommitter:
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


def load_committer(target: str | None, options: Mapping[str, str]) -> Committer:
    """Build the committer named by the ``target`` option."""
    if not target:
        raise RegionalConfigError(
            "the regional sink needs a target: add .option('target', 'delta') "
            "or .option('target', 'python:<module>:<Class>') to writeStream"
        )
    if target == "delta":
        return DeltaCommitter(dict(options))
    if target.startswith("python:"):
        parts = target.split(":")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            raise RegionalConfigError(f"target {target!r} must have the form python:<module>:<Class>")
        _, module_name, class_name = parts
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise RegionalConfigError(
                f"target {target!r}: cannot import module {module_name!r} ({exc}); "
                "it must be importable by the driver and by every Python worker (check PYTHONPATH)"
            ) from None
        cls = getattr(module, class_name, None)
        if cls is None:
            raise RegionalConfigError(f"target {target!r}: module {module_name!r} has no class {class_name!r}")
        committer = cls(dict(options))
        missing = [m for m in ("prepare", "commit", "abort") if not callable(getattr(committer, m, None))]
        if missing:
            raise RegionalConfigError(f"target {target!r}: {class_name} lacks method(s) {', '.join(missing)}")
        return committer
    raise RegionalConfigError(
        f"unknown target {target!r}: use target=delta or target=python:<module>:<Class>"
    )


def commit_with_report(committer: Committer, epoch: int, handles: dict[str, Any], report: EpochReport) -> None:
    if getattr(committer, "wants_report", False):
        committer.commit(epoch, handles, report=report)  # type: ignore[call-arg]
    else:
        committer.commit(epoch, handles)


# -- Delta ---------------------------------------------------------------------


@dataclass(frozen=True)
class StagedFile:
    """A parquet file written under the table directory, not yet in the Delta log."""

    path: str  # relative to the table root
    size: int
    rows: int
    schema: bytes  # Arrow IPC-serialized schema, to create the table on first commit


class DeltaCommitter(RegionalCommitter):
    """Stages parquet files in the task; publishes each epoch as one Delta transaction.

    Idempotency is checked, not assumed: the table's application transaction
    version for this query's ``txnAppId`` is read before committing, and an
    epoch at or below it is skipped (delta-rs does not skip duplicates itself).
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        path = options.get("path")
        if not path:
            raise RegionalConfigError("target=delta needs the table location: add .option('path', '/table/dir')")
        self.table = Path(os.path.abspath(path.removeprefix("file:")))
        checkpoint = options.get("checkpointlocation", "")
        self.app_id = options.get("txnappid") or (
            "regional-" + hashlib.sha256(checkpoint.encode("utf-8")).hexdigest()[:16]
        )

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> StagedFile | None:
        first = next(batches, None)
        if first is None:
            return None
        self.table.mkdir(parents=True, exist_ok=True)
        name = f"part-e{epoch:08d}-{encode_region(region)}-{uuid.uuid4().hex[:12]}.parquet"
        path = self.table / name
        rows = 0
        try:
            with pq.ParquetWriter(path, first.schema, compression="snappy") as writer:
                for batch in chain_first(first, batches):
                    writer.write_batch(batch)
                    rows += batch.num_rows
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return StagedFile(name, path.stat().st_size, rows, first.schema.serialize().to_pybytes())

    def commit(self, epoch: int, handles: dict[str, Any], report: EpochReport | None = None) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.transaction import AddAction

        staged = [h for h in handles.values() if h is not None]
        table = self._open()
        if table is None:
            if not staged:
                return
            schema = pa.ipc.read_schema(pa.py_buffer(staged[0].schema))
            table = DeltaTable.create(str(self.table), schema, mode="ignore")
        table.update_incremental()
        done = table.transaction_version(self.app_id)
        if done is not None and done >= epoch:
            return  # published before a crash: publish nothing twice
        now = int(time.time() * 1000)
        adds = [AddAction(h.path, h.size, {}, now, True, f'{{"numRecords":{h.rows}}}') for h in staged]
        table.create_write_transaction(
            adds, mode="append", schema=table.schema(),
            commit_properties=CommitProperties(
                custom_metadata={"regional": _report_metadata(epoch, report)},
                app_transactions=[Transaction(self.app_id, epoch)],
            ),
        )

    def abort(self, epoch: int, handles: dict[str, Any]) -> None:
        for handle in handles.values():
            if handle is not None:
                (self.table / handle.path).unlink(missing_ok=True)

    def _open(self) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(str(self.table))
        except TableNotFoundError:
            return None


def _report_metadata(epoch: int, report: EpochReport | None) -> dict[str, Any]:
    if report is None:
        return {"epoch": epoch}
    return {
        "epoch": epoch,
        "kind": report.kind,
        "committed": {r: {"start": s, "end": e, "rows": report.rows.get(r, 0)}
                      for r, (s, e) in report.committed.items()},
        "fallen_back": {r: {"ref_epoch": ref, "reason": why} for r, (ref, why) in report.fallen_back.items()},
    }


def chain_first(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``first`` followed by ``rest``: puts back a batch taken to look at it."""
    yield first
    yield from rest
