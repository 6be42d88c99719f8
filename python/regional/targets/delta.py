"""``target=delta``, ``path=<table>``: parquet written per region, one Delta transaction per epoch, on local disk
or an object store (``regional.storage``: ``s3a://``, ``gs://``, ``abfss://``), as delta-spark writes.

Phase one (task): the region's rows go straight into the table's location, as parquet files named
``part-<query id>-e<epoch>-<region>-<random>.parquet``. A Delta table is what its log adds, so these files are
invisible to every reader until an epoch's commit adds them; nothing is ever copied or moved.
Phase two (driver): one Delta transaction adds the committed regions' files, carrying the application transaction
``(regional-<query id>, epoch)`` and the regional report in its commit info (on S3 through delta-rs's conditional
put). Idempotency is checked, not assumed: the table's transaction version for the app id is read first, and an
epoch at or below it is not committed again (delta-rs does not skip duplicates by itself). The files of regions
that fell back are deleted by the driver, which has their names (``abort``); files of task attempts that died are
left to Delta's VACUUM, as delta-spark leaves its own (see ``sweep``).

The storage settings are the session's (``regional.storage.config``): regional's files and delta-rs's commits go
through the same object_store configuration, which never reaches the table's log.

The table's schema is checked on the driver before each epoch's tasks (``open``): the query's columns must be
the table's, by name (exact case), Delta type and nullability, or the start is refused naming the columns.
``mergeSchema=true`` adds the query's new columns in the epoch's own transaction (that epoch is written through
delta-rs's merge mode: delta-rs adds no schema to an append of files already written) and lets the query leave
nullable columns out (they read as null), as delta-spark's option does; type changes are still refused. A
partitioned table's partition columns go into each file's partition values, never into the file: ``open`` hands
them to the tasks (``task_options``), which write one file per partition value.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from regional.dead_letters import REPLAY_COLUMNS, open_table
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.ids import encode_region
from regional.location import Location, parse_location
from regional.protocol.settings import parse_bool
from regional.storage import Storage, open_storage
from regional.storage.config import delta_options
from regional.targets.base import EpochReport, Target, chain_first, reason_class, require_query_id

# Where regional staged files before it wrote them into the table (until 2026-11): an interrupted epoch of then
# is finished by moving them in; the rest is swept.
STAGING_DIR = "_regional_staging"
PARTITION_COLUMNS_OPTION = "regional.partitioncolumns"  # set by open() for the tasks: the table's, as JSON
# Delta types a partition value is written for (as Delta spells them: the value's text, e.g. 2024-01-31).
PARTITION_TYPES = {"string", "long", "integer", "short", "byte", "boolean", "date"}
_EPOCH_DIR = re.compile(r"^e(\d+)$")


def create(options: dict[str, str]) -> DeltaTarget:
    return DeltaTarget(options)


class DeltaTarget(Target[dict[str, Any] | None]):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        path = options.get("path")
        if not path:
            raise RegionalConfigError("target=delta needs the table location: add .option('path', '/table/dir')")
        self.table = parse_location("path", path)
        self.storage: Storage = open_storage(self.table)
        # A dead-letter table (``regional.targets.dead_letter_target``): its columns must be the dead letters'.
        self.dead_letters = parse_bool(options, "regional.deadLetters", default="false")
        query_id = require_query_id("delta", options)
        self.query_id = query_id
        self.app_id = f"regional-{query_id}"
        self.staging = self.storage.child(f"{STAGING_DIR}/{query_id}")  # an older regional's
        self.merge_schema = parse_bool(options, "mergeSchema", default="false")
        # The table's partition columns as open() found them on the driver (tasks get them in their options).
        self.partition_columns: list[str] = json.loads(options.get(PARTITION_COLUMNS_OPTION) or "[]")
        self._delta: Any = None  # the table, opened once per target object (the driver builds one per epoch)

    # -- phase one, in the task -----------------------------------------------------------

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> dict[str, Any] | None:
        first = next(batches, None)
        if first is None:
            return None
        if self.dead_letters:  # staged on the driver, before the intent: a table of another shape is refused
            self._check_dead_letter_schema(first.schema)
        schema = delta_schema(first.schema)
        relabel = schema is not first.schema  # decided once: the hot loop casts only when Delta needs it
        parts = [schema.get_field_index(c) for c in self.partition_columns]
        file_schema = pa.schema([f for i, f in enumerate(schema) if i not in parts], schema.metadata)
        staged: dict[tuple[str | None, ...], _StagedFile] = {}  # partition values -> the file holding them
        prefix = f"part-{self.query_id}-e{epoch:08d}-{encode_region(region)}"
        try:
            for batch in chain_first(first, batches):
                batch = batch.cast(schema) if relabel else batch
                for values, rows in _by_partition(batch, parts):
                    out = staged.get(values)
                    if out is None:
                        out = staged[values] = _StagedFile(self.storage, prefix, file_schema)
                    out.write(rows.select([i for i in range(rows.num_columns) if i not in parts]) if parts else rows)
            for out in staged.values():
                out.close()
        except BaseException:
            for out in staged.values():
                out.discard()
            raise
        files = [{"name": out.name, "size": out.size, "rows": out.rows,
                  "partition": dict(zip(self.partition_columns, values, strict=True))}
                 for values, out in staged.items()]
        return {"files": files, "schema": _encode_schema(schema), "partition_columns": self.partition_columns,
                "in_table": True}

    # -- phase two, on the driver ------------------------------------------------------------

    def commit(self, epoch: int, handles: dict[str, Any], report: EpochReport | None = None) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.transaction import AddAction

        staged = [h for h in handles.values() if h is not None]
        if staged and self.dead_letters:
            self._check_dead_letter_schema(_schema_of(staged[0]))
        table = self._open()
        if table is not None:
            done = table.transaction_version(self.app_id)
            if done is not None and done >= epoch:
                return  # published before a crash: publish nothing twice
        properties = CommitProperties(custom_metadata={"regional": _report_metadata(epoch, self.query_id, report)},
                                      app_transactions=[Transaction(self.app_id, epoch)])
        if table is not None and staged and not self.dead_letters:  # a dead-letter table was checked above
            # The table as it is now, not as open() saw it: another writer may have changed it since.
            new_columns = self._check_schema(_schema_of(staged[0]), staged[0].get("partition_columns", []), table)
            if new_columns:
                self._commit_merging(epoch, staged, table, properties)
                return
        for handle in staged:
            if not handle.get("in_table"):  # staged aside by an older regional, before its crash: move it in
                for f in _files_of(handle):
                    _move_into_table(self.table, f"{STAGING_DIR}/{self.query_id}/e{epoch}", f["name"], epoch)
        self._check_written(epoch, staged)
        if table is None:
            if not staged:
                return
            table = self._delta = DeltaTable.create(self._uri, _schema_of(staged[0]), mode="ignore",
                                                    storage_options=self._delta_options())
        now = int(time.time() * 1000)
        adds = [AddAction(f["name"], int(f["size"]), f.get("partition", {}), now, True,
                          f'{{"numRecords":{int(f["rows"])}}}')
                for h in staged for f in _files_of(h)]
        table.create_write_transaction(adds, mode="append", schema=table.schema(), commit_properties=properties)

    def _commit_merging(self, epoch: int, staged: list[dict[str, Any]], table: Any, properties: Any) -> None:
        """The epoch that adds columns (mergeSchema): its rows are written again through delta-rs's merge mode,
        which puts the new schema and the rows in one transaction. Once per schema change."""
        from deltalake import write_deltalake

        types = {f.name: f.type for f in _arrow_schema(table)}
        parts: list[str] = list(table.metadata().partition_columns)
        pieces = []
        for handle in staged:
            for f in _files_of(handle):
                data = pq.read_table(pa.BufferReader(self._staged_bytes(epoch, handle, f["name"])))
                for column in parts:  # back from the file's partition values into the rows
                    value = f.get("partition", {}).get(column)
                    values = pa.array([value] * data.num_rows, pa.string()).cast(types[column])
                    data = data.append_column(column, values)
                pieces.append(data)
        write_deltalake(table, pa.concat_tables(pieces, promote_options="default"), mode="append",
                        schema_mode="merge", partition_by=parts or None, commit_properties=properties)
        for handle in staged:  # written again by the merge: never added, so no reader ever saw them
            for f in _files_of(handle):
                self._delete_written(epoch, handle, f["name"])

    def _check_written(self, epoch: int, staged: list[dict[str, Any]]) -> None:
        """Every file the epoch adds is there, whole (its size as the task wrote it): a table must never
        reference a file it does not have. One HEAD per file, asked in parallel on an object store."""
        sizes = {f["name"]: int(f["size"]) for h in staged for f in _files_of(h)}
        for name, info in self.storage.heads(sorted(sizes)).items():
            if info is None or info.size != sizes[name]:
                raise _gone(self.storage.describe(name), epoch)

    def _staged_bytes(self, epoch: int, handle: dict[str, Any], name: str) -> bytes:
        """A written file's bytes (in the table, or in an older regional's staging directory)."""
        data = self.storage.read(name)
        if data is None and not handle.get("in_table"):
            data = self.staging.read(f"e{epoch}/{name}")
        if data is None:
            raise _gone(self.storage.describe(name), epoch)
        return data

    def _delete_written(self, epoch: int, handle: dict[str, Any], name: str) -> None:
        if handle.get("in_table"):
            self.storage.delete(name)
        else:
            self.staging.delete(f"e{epoch}/{name}")

    def abort(self, epoch: int, handles: dict[str, Any]) -> None:
        """Delete the files of slices that are not published. A file the table holds is never deleted, whoever
        asks: it was published (a handle may reach here twice, as Spark aborts a batch whose commit failed)."""
        names = [(h, f["name"]) for h in handles.values() if h is not None for f in _files_of(h)]
        if not names:
            return
        table = self._open()
        held = _held_files(table) if table is not None else set()
        for handle, name in names:
            if name not in held:
                self._delete_written(epoch, handle, name)

    def open(self, schema: pa.Schema) -> None:
        """Check the query's columns against the table's before anything is staged (a new table is created by
        the first commit, from the rows' schema), and note its partition columns for the tasks."""
        table = self._open()
        if table is None:
            self.partition_columns = []
            return
        self.partition_columns = list(table.metadata().partition_columns)
        if self.dead_letters:
            self._check_dead_letter_schema(schema)
        else:
            self._check_schema(delta_schema(schema), self.partition_columns, table)

    def task_options(self) -> dict[str, str]:
        return {PARTITION_COLUMNS_OPTION: json.dumps(self.partition_columns)}

    def _check_schema(self, schema: pa.Schema, partition_columns: list[str], table: Any) -> list[str]:
        """The query's new columns (allowed with mergeSchema); anything else that does not fit is refused."""
        have = list(table.metadata().partition_columns)
        if list(partition_columns) != have:
            raise RegionalConfigError(
                f"the Delta table {str(self.table)!r} is partitioned by {have} now, but this epoch's files were "
                f"written for {list(partition_columns)}: was the table replaced while the query ran? Restart "
                "the query: its next epochs are written for the table as it is")
        problems, new = compare_schemas(schema, _arrow_schema(table), have, self.merge_schema)
        if problems:
            raise RegionalConfigError(
                f"the query's columns do not fit the Delta table {str(self.table)!r}: " + "; ".join(problems) +
                ". Select and cast the table's columns in your select(...), write to a new path"
                + ("" if self.merge_schema else ", or set .option('mergeSchema', 'true') to add new columns"))
        return new

    def published(self, epoch: int) -> bool:
        table = self._open()
        if table is None:
            return False
        done = table.transaction_version(self.app_id)
        return done is not None and done >= epoch

    def location(self) -> str:
        return str(self.table)

    @property
    def _uri(self) -> str:
        return str(self.table)

    def _delta_options(self) -> dict[str, str] | None:
        return delta_options(self.table)  # the session's (``regional.storage.config``)

    def _check_dead_letter_schema(self, schema: pa.Schema) -> None:
        """A table that holds other columns, or the same names with other types (another source's dead letters),
        is refused: Delta files of another shape would be added to it unchecked."""
        table = self._open()
        if table is None:
            return
        # A replay (``source=deadLetters``) adds its marks to the table; its writer leaves them null.
        have = pa.schema([f for f in _arrow_schema(table) if f.name not in REPLAY_COLUMNS])
        problems, new = compare_schemas(delta_schema(schema), have, [], merge=False)
        if problems or new or [f.name for f in have] != schema.names:
            raise RegionalConfigError(
                f"deadLetterPath={self.table} is a Delta table with columns {_describe(have)}, but this query's dead "
                f"letters have {_describe(schema)}: give each source type its own dead-letter table")

    def sweep(self, up_to_epoch: int) -> None:
        """Remove what an older regional staged aside for epochs up to ``up_to_epoch`` (``STAGING_DIR``).

        Files in the table's location are never swept by listing: "not in the table now" does not tell a file
        that was never added from one that was added and later removed (OPTIMIZE, DELETE, an overwrite), which
        time travel and lagging readers still need. regional deletes only the files it knows were never added
        (``abort``: the handles of slices that were not published); files of task attempts that died are left
        to Delta's VACUUM, as delta-spark leaves its own."""
        for info in self.staging.list("", recursive=True):
            match = _EPOCH_DIR.match(info.name.split("/", 1)[0])
            if match and int(match.group(1)) <= up_to_epoch:
                self.staging.delete(info.name)

    def _open(self) -> Any:
        """The table, or None before its first commit. Opened once; later calls bring it up to date."""
        if self._delta is not None:
            self._delta.update_incremental()
            return self._delta
        self._delta = open_table(self.table)
        return self._delta


def delta_schema(schema: pa.Schema) -> pa.Schema:
    """Spark hands timestamps over in the session's time zone; Delta's ``timestamp`` is an instant in UTC
    (the same values, another label)."""
    relabel = {i for i, f in enumerate(schema) if pa.types.is_timestamp(f.type) and f.type.tz not in (None, "UTC")}
    if not relabel:
        return schema
    return pa.schema([f.with_type(pa.timestamp(f.type.unit, tz="UTC")) if i in relabel else f
                      for i, f in enumerate(schema)], schema.metadata)


def compare_schemas(query: pa.Schema, table: pa.Schema, partition_columns: list[str],
                    merge: bool) -> tuple[list[str], list[str]]:
    """(problems, new columns) of writing rows of ``query`` into a table of Arrow schema ``table``. Compared as
    Delta types; names exactly (Delta ignores case, Parquet readers may not: a column that differs only in case
    is refused); a nullable query column into a NOT NULL one is refused (Spark says whether a column can be
    null: ``coalesce`` makes it non-null). Without ``merge``, the query must write every column of the table."""
    from deltalake import Schema

    wanted = {f.name: f for f in Schema.from_arrow(query).fields}
    have = {f.name: f for f in Schema.from_arrow(table).fields}
    by_lower = {n.lower(): n for n in have}
    problems, new = [], []
    for name, field in wanted.items():
        current = have.get(name)
        if current is None:
            other = by_lower.get(name.lower())
            if other is not None:
                problems.append(f"column {name!r} is {other!r} in the table (names differ in case only): rename it")
            elif merge:
                new.append(name)
            else:
                problems.append(f"column {name!r} ({_delta_type(field)}) is not in the table")
            continue
        if _delta_type(field) != _delta_type(current):
            problems.append(f"column {name!r} is {_delta_type(current)} in the table, the query writes "
                            f"{_delta_type(field)}")
        elif field.nullable and not current.nullable:
            problems.append(f"column {name!r} is NOT NULL in the table, and the query's may be null")
    for name, current in have.items():
        if name in wanted or any(w.lower() == name.lower() for w in wanted):
            continue
        if name in partition_columns:
            problems.append(f"partition column {name!r} is not written")
        elif not merge:
            problems.append(f"column {name!r} ({_delta_type(current)}) of the table is not written (with mergeSchema "
                            "it would be null in new rows)")
        elif not current.nullable:
            problems.append(f"column {name!r} is NOT NULL in the table, and the query does not write it")
    for name in partition_columns:
        if name in have and _delta_type(have[name]) not in PARTITION_TYPES:
            problems.append(f"partition column {name!r} is {_delta_type(have[name])}: regional writes partition "
                            f"values of types {sorted(PARTITION_TYPES)} only")
    return problems, new


def _delta_type(field: Any) -> str:
    kind = field.type
    return str(kind.type) if type(kind).__name__ == "PrimitiveType" else str(kind.to_json())


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def _arrow_schema(table: Any) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


class _StagedFile:
    """One parquet file a task writes into the table's location: one per partition value of a partitioned table,
    else one per slice. It exists, whole, once closed; a discarded one never appears."""

    def __init__(self, storage: Storage, prefix: str, schema: pa.Schema) -> None:
        self.name = f"{prefix}-{uuid.uuid4().hex[:12]}.parquet"
        self.storage = storage
        self.rows = 0
        self.size = 0
        self._file = storage.open_writer(self.name)
        self._writer = pq.ParquetWriter(self._file, schema, compression="snappy")

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def close(self) -> None:
        self._writer.close()  # the parquet footer; the file object stays open
        self.size = self._file.tell()
        self._file.close()

    def discard(self) -> None:
        with contextlib.suppress(Exception):  # the footer, into the file that is then dropped unfinished
            self._writer.close()
        self.storage.discard(self._file)


def _by_partition(batch: pa.RecordBatch, parts: list[int]) -> Iterator[tuple[tuple[str | None, ...], pa.RecordBatch]]:
    """The batch's rows per partition value (as Delta writes it: the value's text, or None for null)."""
    if not parts:
        yield (), batch
        return
    keys = [pc.cast(batch.column(i), pa.string()) for i in parts]
    combos = pa.table(dict(zip(map(str, range(len(parts))), keys, strict=True))).group_by(
        [str(i) for i in range(len(parts))]).aggregate([])
    for row in combos.to_pylist():
        values = tuple(row[str(i)] for i in range(len(parts)))
        mask = None
        for key, value in zip(keys, values, strict=True):
            match = pc.is_null(key) if value is None else pc.fill_null(pc.equal(key, value), False)
            mask = match if mask is None else pc.and_(mask, match)
        yield values, batch.filter(mask)


def _held_files(table: Any) -> set[str]:
    """The paths (relative to the table) of the files the table holds now."""
    from urllib.parse import unquote

    return {unquote(str(p)) for p in table.get_add_actions().column("path").to_pylist()}


def _files_of(handle: dict[str, Any]) -> list[dict[str, Any]]:
    """The files a handle staged (a handle written before partitioned tables named one file, with no partition)."""
    return list(handle["files"]) if "files" in handle else [handle]


def _encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def _schema_of(handle: dict[str, Any]) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(handle["schema"])))


def _move_into_table(table: Location, staging: str, name: str, epoch: int) -> None:
    """A file an older regional staged aside (local tables only), into the table directory; a re-run finds it
    moved already."""
    source, target = os.path.join(table.path, staging, name), os.path.join(table.path, name)
    try:
        os.replace(source, target)
    except FileNotFoundError:
        if not os.path.exists(target):
            raise _gone(source, epoch) from None


def _gone(where: str, epoch: int) -> RegionalStoreError:
    return RegionalStoreError(
        f"the file {where} of epoch {epoch} is gone before it was published (was it deleted by hand?); its rows "
        "cannot be published. Restore it, or start a new checkpointLocation")


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
