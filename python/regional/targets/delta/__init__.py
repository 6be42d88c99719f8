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
them to the tasks (``task_options``), which write one file per partition value. Partition values are written as
delta-spark writes them: an empty string, and ``__HIVE_DEFAULT_PARTITION__``, is null.

The table's protocol is honoured or the table refused (``features``): at ``open`` (and again at each commit) every
table feature is either written with its rules or refused by name before anything is staged. The rules travel
to the tasks (``rows``): CHECK constraints, invariants and NOT NULL columns are checked on the rows (a row that
breaks one is refused with ``RowsInvalid``: quarantined and, with dead letters on, dead-lettered, never
published), generated columns are computed or checked, and under column mapping the files hold the physical
column names and field ids. A table with none of these costs the tasks nothing more.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from regional.dead_letters import REPLAY_COLUMNS, open_table
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.ids import encode_region
from regional.location import Location, parse_location
from regional.options import Option, OptionTable
from regional.protocol.settings import parse_bool, parse_int
from regional.storage import Storage, open_storage
from regional.storage.config import delta_options
from regional.targets.base import EpochReport, Target, chain_first, reason_class, require_query_id
from regional.targets.delta.features import Rules, table_rules
from regional.targets.delta.rows import RowRules
from regional.targets.delta.staged import StagedFile
from regional.targets.delta.stats import FileStats, Spec, table_spec

# Where regional staged files before it wrote them into the table (until 2026-11): an interrupted epoch of then
# is finished by moving them in; the rest is swept.
STAGING_DIR = "_regional_staging"
PARTITION_COLUMNS_OPTION = "regional.partitioncolumns"  # set by open() for the tasks: the table's, as JSON
RULES_OPTION = "regional.deltarules"  # set by open() for the tasks when the table has rules (features.Rules)
STATS_OPTION = "regional.deltastats"  # set by open() for the tasks: the table's indexed columns (stats.spec)
# Delta types a partition value is written for (as Delta spells them: the value's text, e.g. 2024-01-31).
PARTITION_TYPES = {"string", "long", "integer", "short", "byte", "boolean", "date"}
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # a partition value of this text is null, as delta-spark logs it
_EPOCH_DIR = re.compile(r"^e(\d+)$")


_REFUSED_STOCK = "regional's Delta target only appends, one transaction per epoch"
OPTIONS = OptionTable("target=delta", [
    Option("path", "required", "The Delta table's location (local, `s3a://`, `gs://`, `abfss://`); created by the "
                               "first epoch if it does not exist.", stock=True),
    Option("mergeSchema", "false", "Add the query's new columns to the table (nullable, in the epoch's own "
                                   "transaction) and let the query leave nullable columns out, as delta-spark's "
                                   "option does. Type changes are refused.", stock=True),
    Option("maxRecordsPerFile", "0", "At most this many rows per Parquet file (0: no limit), as delta-spark's "
                                     "option.", stock=True),
    Option("userMetadata", "", "Put into each of the query's commits as `commitInfo.userMetadata`, as "
                               "delta-spark's option does.", stock=True),
    Option("compression", "snappy", "The Parquet files' codec: `snappy`, `zstd`, `gzip` or `uncompressed`.",
           stock=True),
    Option("overwriteSchema", "", "", refused=f"{_REFUSED_STOCK}. Change the schema with delta-spark while the "
                                              "query is stopped", stock=True),
    Option("replaceWhere", "", "", refused=f"{_REFUSED_STOCK}. Delete with delta-spark (DELETE FROM ...)",
           stock=True),
    Option("partitionOverwriteMode", "", "", refused=f"{_REFUSED_STOCK}: nothing is overwritten", stock=True),
    Option("txnAppId", "", "", refused="regional makes each epoch idempotent with its own application "
                                       "transaction (regional-<query id>, epoch). Remove the option", stock=True),
    Option("txnVersion", "", "", refused="regional makes each epoch idempotent with its own application "
                                         "transaction (regional-<query id>, epoch). Remove the option", stock=True),
    Option("optimizeWrite", "", "", refused="regional writes one file per region, partition value and epoch "
                                            "(split by maxRecordsPerFile). Compact with OPTIMIZE", stock=True),
    Option("dataChange", "true", "", refused="regional's files are new data: dataChange=false would hide them "
                                             "from streaming readers of the table. Remove the option", stock=True),
    Option("partitionBy", "", "", refused="the table's partitioning is the table's: create it partitioned with "
                                          "delta-spark (PARTITIONED BY) before the first epoch", stock=True),
    Option("delta.", "", "", refused="table properties are set with delta-spark (CREATE TABLE ... TBLPROPERTIES "
                                     "or ALTER TABLE ... SET TBLPROPERTIES), not per write", prefix=True, stock=True),
])
_CODECS = {"snappy": "snappy", "zstd": "zstd", "gzip": "gzip", "uncompressed": "none", "none": "none"}


def _compression(options: dict[str, str]) -> str:
    given = next((v for k, v in options.items() if k.lower() == "compression"), "snappy").strip().lower()
    if given not in _CODECS:
        raise RegionalConfigError(f"target=delta option compression={given!r}: give one of {sorted(_CODECS)}")
    return _CODECS[given]


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
        self.max_records = parse_int(options, "maxRecordsPerFile", 0, default="0")
        self.compression = _compression(options)
        self.user_metadata = next((v for k, v in options.items() if k.lower() == "usermetadata"), None)
        # The table's partition columns as open() found them on the driver (tasks get them in their options).
        self.partition_columns: list[str] = json.loads(options.get(PARTITION_COLUMNS_OPTION) or "[]")
        given_rules = options.get(RULES_OPTION)
        self.rules = Rules.from_json(given_rules) if given_rules else Rules()  # open() finds them on the driver
        given_stats = options.get(STATS_OPTION)
        # The columns whose min/max/null count the files' stats carry (None: a new table, its defaults).
        self.stats_spec: Spec | None = json.loads(given_stats) if given_stats else None
        self._delta: Any = None  # the table, opened once per target object (the driver builds one per epoch)

    # -- phase one, in the task -----------------------------------------------------------

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> dict[str, Any] | None:
        first = next(batches, None)
        if first is None:
            return None
        if self.dead_letters:  # staged on the driver, before the intent: a table of another shape is refused
            self._check_dead_letter_schema(first.schema)
        query = delta_schema(first.schema)
        relabel = query is not first.schema  # decided once: the hot loop casts only when Delta needs it
        # The table's rules (none for most tables: then nothing more is done per batch).
        rules = RowRules(self.rules, query, str(self.table)) if self.rules else None
        schema = rules.out_schema(query) if rules is not None else query
        parts = [schema.get_field_index(c) for c in self.partition_columns]
        logical_file = pa.schema([f for i, f in enumerate(schema) if i not in parts], schema.metadata)
        file_schema = rules.file_schema(logical_file) if rules is not None else logical_file
        # partition values -> the files holding them (the last one open; more than one with maxRecordsPerFile)
        staged: dict[tuple[str | None, ...], list[StagedFile]] = {}
        prefix = f"part-{self.query_id}-e{epoch:08d}-{encode_region(region)}"
        try:
            for batch in chain_first(first, batches):
                batch = batch.cast(query) if relabel else batch
                if rules is not None:
                    batch = rules.apply(batch)  # RowsInvalid for a row that breaks a rule: nothing is kept
                for values, rows in _by_partition(batch, parts):
                    outs = staged.setdefault(values, [])
                    data = rows.select([i for i in range(rows.num_columns) if i not in parts]) if parts else rows
                    data = rules.to_file(data, file_schema) if rules is not None else data
                    while data.num_rows:
                        if not outs or (self.max_records and outs[-1].rows >= self.max_records):
                            if outs:
                                outs[-1].close()
                            outs.append(StagedFile(self.storage, prefix, file_schema, self.compression,
                                                   FileStats(self.stats_spec, file_schema)))
                        room = self.max_records - outs[-1].rows if self.max_records else data.num_rows
                        outs[-1].write(data.slice(0, room))
                        data = data.slice(room)
            for outs in staged.values():
                outs[-1].close()
        except BaseException:
            for outs in staged.values():
                for out in outs:
                    out.discard()
            raise
        keys = [self.rules.physical_partition(c) for c in self.partition_columns]  # physical names, if mapped
        files = [{"name": out.name, "size": out.size, "rows": out.rows, "stats": out.stats.to_json(),
                  "partition": dict(zip(keys, values, strict=True))}
                 for values, outs in staged.items() for out in outs]
        handle = {"files": files, "schema": _encode_schema(schema), "partition_columns": self.partition_columns,
                  "in_table": True}
        if self.rules:
            handle["rules"] = self.rules.digest()
        return handle

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
        custom: dict[str, Any] = {"regional": _report_metadata(epoch, self.query_id, report)}
        if self.user_metadata is not None:  # commitInfo.userMetadata, as delta-spark's option puts it
            custom["userMetadata"] = self.user_metadata
        # What delta-spark's streaming append says of its commit (DESCRIBE HISTORY shows it): an append that read
        # no data, at the table's version it was checked against. delta-rs names the operation itself ("WRITE",
        # with its own mode and partitionBy parameters) and refuses to have it set; the query's own parameters
        # are added to them.
        custom.update({"operationParameters": {"outputMode": "Append", "queryId": self.query_id,
                                               "epochId": str(epoch)},
                       "isBlindAppend": True, "isolationLevel": "Serializable"})
        if table is not None:
            custom["readVersion"] = table.version()
        properties = CommitProperties(custom_metadata=custom, app_transactions=[Transaction(self.app_id, epoch)])
        if table is not None and staged and not self.dead_letters:  # a dead-letter table was checked above
            # The table as it is now, not as open() saw it: another writer may have changed it since.
            new_columns = self._check_schema(_schema_of(staged[0]), staged[0].get("partition_columns", []), table)
            self._check_rules(epoch, staged, table)
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
                          f.get("stats") or f'{{"numRecords":{int(f["rows"])}}}')  # a handle of before stats
                for h in staged for f in _files_of(h)]
        files = [f for h in staged for f in _files_of(h)]
        # delta-spark's streaming append's metrics (its STREAMING UPDATE's, and numFiles, its WRITE's), as strings
        # as it writes them; delta-rs writes none here.
        custom["operationMetrics"] = {"numAddedFiles": str(len(files)), "numRemovedFiles": "0",
                                      "numFiles": str(len(files)),
                                      "numOutputRows": str(sum(int(f["rows"]) for f in files)),
                                      "numOutputBytes": str(sum(int(f["size"]) for f in files))}
        custom["readVersion"] = table.version()  # a table this commit created: the version it created
        properties = CommitProperties(custom_metadata=custom, app_transactions=[Transaction(self.app_id, epoch)])
        table.create_write_transaction(adds, mode="append", schema=table.schema(), commit_properties=properties)

    def _check_rules(self, epoch: int, staged: list[dict[str, Any]], table: Any) -> None:
        """The table's features and rules now are the ones the tasks wrote for (a feature regional refuses, a
        constraint added, a column mapped anew since ``open``: the epoch's rows were not written for them)."""
        rules = table_rules(table, str(self.table), _schema_of(staged[0]), self.merge_schema)
        wrote = {h.get("rules", Rules().digest()) for h in staged}
        if wrote != {rules.digest()}:
            raise RegionalStoreError(
                f"the Delta table {str(self.table)!r} changed its rules (a CHECK constraint, NOT NULL, a generated "
                f"column or column mapping) while epoch {epoch} was written: its rows were checked and written for "
                "the table as it was, so they are not published. Undo the table's change, restart the query so "
                "that the epoch is published, then make the change again while the query is stopped")

    def _commit_merging(self, epoch: int, staged: list[dict[str, Any]], table: Any, properties: Any) -> None:
        """The epoch that adds columns (mergeSchema): its rows are written again through delta-rs's merge mode,
        which puts the new schema and the rows in one transaction. Once per schema change."""
        from deltalake import write_deltalake

        have = {f.name: f for f in _arrow_schema(table)}
        types = {name: f.type for name, f in have.items()}
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
        rows = pa.concat_tables(pieces, promote_options="default")
        # New columns are added nullable, as delta-spark's mergeSchema adds them: older rows have no value. The
        # table's columns keep their nullability, as delta-spark's merge keeps it (delta-rs's merge mode makes a
        # column nullable when the rows' is): the rows were checked against the table's NOT NULLs in the tasks
        # (a cast refuses a null left in one). Fields' metadata (comments, generation expressions) and the table's
        # configuration (its constraints) are kept by delta-rs's merge.
        rows = rows.cast(pa.schema([_as_in_table(f, have[f.name]) if f.name in have else f.with_nullable(True)
                                    for f in rows.schema], rows.schema.metadata))
        write_deltalake(table, rows, mode="append",
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
        self.stats_spec = table_spec(table)
        if self.dead_letters:
            self._check_dead_letter_schema(schema)
        else:
            # The protocol first: a feature regional refuses is named before any column is compared.
            self.rules = table_rules(table, str(self.table), delta_schema(schema), self.merge_schema)
            self._check_schema(delta_schema(schema), self.partition_columns, table)

    def task_options(self) -> dict[str, str]:
        options = {PARTITION_COLUMNS_OPTION: json.dumps(self.partition_columns)}
        if self.stats_spec is not None:
            options[STATS_OPTION] = json.dumps(self.stats_spec)
        if self.rules:
            options[RULES_OPTION] = self.rules.to_json()
        return options

    def _check_schema(self, schema: pa.Schema, partition_columns: list[str], table: Any) -> list[str]:
        """The query's new columns (allowed with mergeSchema); anything else that does not fit is refused."""
        have = list(table.metadata().partition_columns)
        if list(partition_columns) != have:
            raise RegionalConfigError(
                f"the Delta table {str(self.table)!r} is partitioned by {have} now, but this epoch's files were "
                f"written for {list(partition_columns)}: was the table replaced while the query ran? Restart "
                "the query: its next epochs are written for the table as it is")
        generated = [name for name, _ in self.rules.generated]
        problems, new = compare_schemas(schema, _arrow_schema(table), have, self.merge_schema, generated)
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
        try:
            self._delta = open_table(self.table)
        except Exception as exc:
            if "feature" not in str(exc).lower() and "protocol" not in str(exc).lower():
                raise
            # A protocol delta-rs cannot even read (a newer version, a feature it does not know): refused as the
            # features regional refuses are, before anything is staged.
            raise RegionalConfigError(
                f"the Delta table {str(self.table)!r} has a protocol regional does not write ({exc}). Write to a "
                "table without the feature named, or with delta-spark") from None
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
                    merge: bool, generated: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(problems, new columns) of writing rows of ``query`` into a table of Arrow schema ``table``. Compared as
    Delta types; names exactly (Delta ignores case, Parquet readers may not: a column that differs only in case
    is refused); a nullable query column may go into a NOT NULL one, as with delta-spark: the tasks refuse its
    null rows (``rows``). Without ``merge``, the query must write every column of the table but its
    ``generated`` ones (computed in the tasks)."""
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
    for name, current in have.items():
        if name in wanted or any(w.lower() == name.lower() for w in wanted) or name in (generated or []):
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
    """The field's Delta type, as the protocol spells it, without its fields' metadata (column mapping's physical
    names and ids are the table's, never the query's)."""
    kind = field.type
    if type(kind).__name__ == "PrimitiveType":
        return str(kind.type)
    return json.dumps(_without_metadata(json.loads(kind.to_json())), separators=(",", ":"))


def _without_metadata(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_metadata(v) for k, v in value.items() if k != "metadata"}
    if isinstance(value, list):
        return [_without_metadata(v) for v in value]
    return value


def _as_in_table(field: pa.Field, table: pa.Field) -> pa.Field:
    """A column of the rows, with the table's nullability (nested fields' too: the table's type, which
    ``compare_schemas`` found to be the rows' as Delta types)."""
    kind = table.type if pa.types.is_nested(field.type) else field.type
    return field.with_type(kind).with_nullable(table.nullable)


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def _arrow_schema(table: Any) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def _by_partition(batch: pa.RecordBatch, parts: list[int]) -> Iterator[tuple[tuple[str | None, ...], pa.RecordBatch]]:
    """The batch's rows per partition value (as Delta writes it: the value's text, or None for null)."""
    if not parts:
        yield (), batch
        return
    # As delta-spark writes them: an empty string is null (Hive's partition layout has no empty value).
    keys = [_empty_is_null(pc.cast(batch.column(i), pa.string())) for i in parts]
    combos = pa.table(dict(zip(map(str, range(len(parts))), keys, strict=True))).group_by(
        [str(i) for i in range(len(parts))]).aggregate([])
    for row in combos.to_pylist():
        values = tuple(row[str(i)] for i in range(len(parts)))
        mask = None
        for key, value in zip(keys, values, strict=True):
            match = pc.is_null(key) if value is None else pc.fill_null(pc.equal(key, value), False)
            mask = match if mask is None else pc.and_(mask, match)
        yield values, batch.filter(mask)


def _empty_is_null(values: pa.Array) -> pa.Array:
    """An empty string, and Hive's name for null (``__HIVE_DEFAULT_PARTITION__``), are null: delta-spark writes
    both into the partition directory's name as Hive's null, and logs them null."""
    null = pc.is_in(values, pa.array(["", HIVE_NULL]))
    if not pc.any(null).as_py():
        return values
    return pc.if_else(null, pa.scalar(None, pa.string()), values)


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
