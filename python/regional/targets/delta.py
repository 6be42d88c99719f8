"""``target=delta``, ``path=<table>``: parquet staged per region, one Delta transaction per epoch.

Phase one (task): the region's rows go to a parquet file under
``<table>/_regional_staging/<query id>/e<epoch>/`` (a hidden directory: readers never see it).
Phase two (driver): the committed regions' files move into the table directory and one Delta
transaction adds them, carrying the application transaction ``(regional-<query id>, epoch)`` and
the regional report in its commit info. Idempotency is checked, not assumed: the table's transaction
version for the app id is read first, and an epoch at or below it is not committed again (delta-rs
does not skip duplicates by itself). Whatever is left in the staging directory for a recorded epoch
will never be published: ``sweep`` removes it.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from regional.errors import RegionalConfigError, RegionalStoreError
from regional.ids import encode_region
from regional.location import local_path
from regional.protocol.settings import parse_bool
from regional.targets.base import EpochReport, Target, chain_first, reason_class, require_query_id

STAGING_DIR = "_regional_staging"
_EPOCH_DIR = re.compile(r"^e(\d+)$")


def create(options: dict[str, str]) -> DeltaTarget:
    return DeltaTarget(options)


class DeltaTarget(Target[dict[str, Any] | None]):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        path = options.get("path")
        if not path:
            raise RegionalConfigError("target=delta needs the table location: add .option('path', '/table/dir')")
        self.table = local_path("path", path)
        # A dead-letter table (``regional.targets.dead_letter_target``): its columns must be the dead letters'.
        self.dead_letters = parse_bool(options, "regional.deadLetters", default="false")
        query_id = require_query_id("delta", options)
        self.query_id = query_id
        self.app_id = f"regional-{query_id}"
        self.staging = self.table / STAGING_DIR / query_id
        self._delta: Any = None  # the table, opened once per target object (the driver builds one per epoch)

    # -- phase one, in the task -----------------------------------------------------------

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> dict[str, Any] | None:
        first = next(batches, None)
        if first is None:
            return None
        if self.dead_letters:  # staged on the driver, before the intent: a table of another shape is refused
            self._check_dead_letter_columns(first.schema.names)
        directory = self.staging / f"e{epoch}"
        directory.mkdir(parents=True, exist_ok=True)
        name = f"part-{self.query_id[:8]}-e{epoch:08d}-{encode_region(region)}-{uuid.uuid4().hex[:12]}.parquet"
        path = directory / name
        rows = 0
        schema = delta_schema(first.schema)
        relabel = schema is not first.schema  # decided once: the hot loop casts only when Delta needs it
        try:
            with pq.ParquetWriter(path, schema, compression="snappy") as writer:
                for batch in chain_first(first, batches):
                    writer.write_batch(batch.cast(schema) if relabel else batch)
                    rows += batch.num_rows
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return {"name": name, "size": path.stat().st_size, "rows": rows,
                "schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")}

    # -- phase two, on the driver ------------------------------------------------------------

    def commit(self, epoch: int, handles: dict[str, Any], report: EpochReport | None = None) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.transaction import AddAction

        staged = [h for h in handles.values() if h is not None]
        if staged and self.dead_letters:
            self._check_dead_letter_columns(_schema_of(staged[0]).names)
        staging, table_dir = os.fspath(self.staging / f"e{epoch}"), os.fspath(self.table)
        for handle in staged:  # into the table directory; a re-run finds them moved already
            _move_into_table(staging, table_dir, handle["name"], epoch)
        table = self._open()
        if table is None:
            if not staged:
                return
            table = self._delta = DeltaTable.create(str(self.table), _schema_of(staged[0]), mode="ignore")
        done = table.transaction_version(self.app_id)
        if done is not None and done >= epoch:
            return  # published before a crash: publish nothing twice
        now = int(time.time() * 1000)
        adds = [AddAction(h["name"], int(h["size"]), {}, now, True, f'{{"numRecords":{int(h["rows"])}}}')
                for h in staged]
        table.create_write_transaction(
            adds, mode="append", schema=table.schema(),
            commit_properties=CommitProperties(
                custom_metadata={"regional": _report_metadata(epoch, self.query_id, report)},
                app_transactions=[Transaction(self.app_id, epoch)],
            ),
        )

    def abort(self, epoch: int, handles: dict[str, Any]) -> None:
        for handle in handles.values():
            if handle is not None:
                (self.staging / f"e{epoch}" / handle["name"]).unlink(missing_ok=True)

    def published(self, epoch: int) -> bool:
        table = self._open()
        if table is None:
            return False
        done = table.transaction_version(self.app_id)
        return done is not None and done >= epoch

    def location(self) -> str:
        return str(self.table)

    def columns(self) -> list[str] | None:
        """The table's column names; None before its first commit."""
        table = self._open()
        return None if table is None else [f.name for f in table.schema().fields]

    def _check_dead_letter_columns(self, names: list[str]) -> None:
        """A table that holds other columns (another source's dead letters) is refused: Delta files of
        another shape would be added to it unchecked."""
        have = self.columns()
        if have is not None and have != names:
            raise RegionalConfigError(
                f"deadLetterPath={self.table} is a Delta table with columns {have}, but this query's dead letters "
                f"have {names}: give each source type its own dead-letter table")

    def sweep(self, up_to_epoch: int) -> None:
        """Remove staged files of epochs up to ``up_to_epoch``: their epochs are recorded, so what was
        published has moved into the table and what is left (dead tasks, discarded slices) never will."""
        for entry in self.staging.iterdir() if self.staging.is_dir() else ():
            match = _EPOCH_DIR.match(entry.name)
            if match and int(match.group(1)) <= up_to_epoch:
                shutil.rmtree(entry, ignore_errors=True)

    def _open(self) -> Any:
        """The table, or None before its first commit. Opened once; later calls bring it up to date."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if self._delta is not None:
            self._delta.update_incremental()
            return self._delta
        try:
            self._delta = DeltaTable(str(self.table))
        except TableNotFoundError:
            return None
        return self._delta


def delta_schema(schema: pa.Schema) -> pa.Schema:
    """Spark hands timestamps over in the session's time zone; Delta's ``timestamp`` is an instant in UTC
    (the same values, another label)."""
    relabel = {i for i, f in enumerate(schema) if pa.types.is_timestamp(f.type) and f.type.tz not in (None, "UTC")}
    if not relabel:
        return schema
    return pa.schema([f.with_type(pa.timestamp(f.type.unit, tz="UTC")) if i in relabel else f
                      for i, f in enumerate(schema)], schema.metadata)


def _schema_of(handle: dict[str, Any]) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(handle["schema"])))


def _move_into_table(staging: str, table: str, name: str, epoch: int) -> None:
    """One staged file into the table directory (plain string paths: this runs once per region per epoch)."""
    try:
        os.replace(os.path.join(staging, name), os.path.join(table, name))
    except FileNotFoundError:
        if not os.path.exists(os.path.join(table, name)):
            raise RegionalStoreError(
                f"the staged file {os.path.join(staging, name)} of epoch {epoch} is gone before it was published "
                "(was the table's staging directory cleaned by hand?); its rows cannot be published. Restore it, "
                "or start a new checkpointLocation"
            ) from None


def _report_metadata(epoch: int, query_id: str, report: EpochReport | None) -> dict[str, Any]:
    if report is None:
        return {"epoch": epoch, "query_id": query_id}
    return {
        "epoch": epoch,
        "query_id": query_id,
        "kind": report.kind,
        "committed": {r: {"start": s, "end": e, "rows": report.rows.get(r, 0)}
                      for r, (s, e) in report.committed.items()},
        "fallen_back": {r: {"ref_epoch": ref, "reason": reason_class(why)}
                        for r, (ref, why) in report.fallen_back.items()},
    }
