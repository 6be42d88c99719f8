"""``source=deadLetters``, ``path=<dead-letter table>``: replay the records a query dead-lettered.

A dead-letter table (``deadLetterPath``, ``regional.dead_letters``) holds each record isolated as poison as its
source read it (``region``, ``offset``, the source's own columns), then ``epoch`` and ``error``. This source reads
them back as that source's records: the same columns, regions and offsets. So the query that failed on them runs
again unchanged (the same select, into the same target) with every regional guarantee, and writes what the first
query would have written. A record that fails again goes to the replay's own ``deadLetterPath``.

- Offsets: a region's records keep their original offsets, a sparse log (like a compacted topic). Its query
  dead-letters a region's records in offset order, as it moves on, so the table grows in that order too.
- Marks: after each recorded epoch (``on_recorded``) the records the epoch published, or dead-lettered again, are
  marked in the table itself: ``replayed_by`` (the replay's query id) and ``replayed_epoch`` (one Delta
  transaction; the columns are added by the first replay, and the table's writer leaves them null). A replay
  reads no record another replay marked: a second replay of the same table takes only what is new.
- A record that reaches the table below where this replay already is (two queries share the table, or its query
  started again from earlier offsets) would never be read: the replay fails, saying so, rather than skip it.

Where each method runs: ``available``, ``split`` and ``on_recorded`` on the driver; ``read`` in the task, which
reads the table through delta-rs at the version the driver planned against.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from regional import failpoints
from regional.dead_letters import (
    DEAD_LETTER_COLUMNS,
    DEAD_LETTER_TABLE,
    REPLAY_COLUMNS,
    REPLAYED_BY,
    REPLAYED_EPOCH,
    open_table,
    query_table,
    sql_text,
    table_columns,
)
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.inputs.base import BATCH_ROWS, AcknowledgingInput, RegionInput, StoredInput
from regional.location import Location, parse_location
from regional.store.model import EpochRecord

if TYPE_CHECKING:
    from regional.store import Store

MARK_REGIONS_PER_UPDATE = 500  # regions per marking UPDATE: its predicate names each
MARK_TRIES = 5  # a marking UPDATE that lost a race with the table's writer (a Delta conflict) is tried again


def create(options: dict[str, str]) -> DeadLetterInput:
    return DeadLetterInput(options)


@dataclass(frozen=True)
class DeadLetterSplit:
    """What a task needs to read a range: the table's version planned against, and whose marks it may read."""

    version: int
    query_id: str


class DeadLetterInput(RegionInput[DeadLetterSplit], StoredInput, AcknowledgingInput):
    schema: pa.Schema
    schema_ddl: str
    probe_span = 1 << 40  # a sparse log: the probe reads every record of the region before (or after) the suspect

    def __init__(self, options: Mapping[str, str]) -> None:
        path = options.get("path")
        if not path:
            raise RegionalConfigError("source=deadLetters needs the dead-letter table: add .option('path', <the "
                                      "deadLetterPath of the query whose dead letters to replay>)")
        self.table = parse_location("path", path)
        table = open_table(self.table)
        if table is None:
            raise RegionalConfigError(f"source=deadLetters: there is no Delta table at {self.table}; a dead-letter "
                                      "table is created by its query's first dead letter (deadLetterPath)")
        columns = pa.schema(table.schema().to_arrow())
        names = columns.names
        if names[:2] != ["region", "offset"] or any(c not in names for c in DEAD_LETTER_COLUMNS):
            raise RegionalConfigError(f"source=deadLetters: the Delta table at {self.table} is not a regional "
                                      f"dead-letter table (its columns are {names[:8]}; one has region, offset, "
                                      "the source's columns, then epoch and error)")
        # The source's own columns: what the query that dead-lettered them read.
        self.schema = pa.schema([plain_type(f) for f in columns
                                 if f.name not in DEAD_LETTER_COLUMNS and f.name not in REPLAY_COLUMNS])
        self.schema_ddl = spark_ddl(self.schema)
        self._store: Store | None = None
        self._version: int | None = None  # the table's version the last plan was made against
        self._committed: dict[str, int] = {}  # each region's committed offset, as of the last recorded epoch

    def table_location(self) -> str:
        return str(self.table)

    def use_store(self, store: Store) -> None:
        self._store = store

    # -- on the driver ---------------------------------------------------------------------------

    def available(self, epoch: int) -> dict[str, int]:
        table = self._open()
        self._version = table.version()
        marked = REPLAYED_BY in table_columns(table)
        marks_column = f", {REPLAYED_BY}" if marked else ""
        rows = query_table(table, f'SELECT region, "offset"{marks_column} FROM {DEAD_LETTER_TABLE}')
        regions, offsets = rows.column("region").to_pylist(), rows.column("offset").to_pylist()
        marks = rows.column(REPLAYED_BY).to_pylist() if marked else [None] * len(regions)
        ends: dict[str, int] = {}
        late: list[tuple[str, int]] = []
        for region, offset, by in zip(regions, offsets, marks, strict=True):
            ends[region] = max(ends.get(region, 0), offset + 1)
            if by is None and offset < self._committed.get(region, 0):
                late.append((region, offset))
        if late:
            region, offset = min(late)
            raise RegionalStoreError(
                f"source=deadLetters: {len(late)} record(s) reached the dead-letter table {self.table} after this "
                f"replay had passed their offsets (e.g. region {region!r} at offset {offset}, below its committed "
                f"offset {self._committed[region]}): two queries share the table, or its query started again from "
                "earlier offsets. This replay would never read them; replay them with a new checkpointLocation (it "
                "takes only records no replay has marked)")
        return ends

    def split(self, region: str, start: int, end: int) -> DeadLetterSplit:
        version = self._version if self._version is not None else self._open().version()
        return DeadLetterSplit(version, self._query_id())

    def on_recorded(self, record: EpochRecord) -> None:
        """Mark what ``record`` published or dead-lettered again as replayed by this query in that epoch."""
        self._committed = {r: s.committed_offset for r, s in record.regions.items()}
        spans = sorted([(r, s.start, s.end) for r, s in record.committed.items()]
                       + [(r, d.offset, d.offset + 1) for r, d in record.dead_lettered.items()])
        if spans:
            failpoints.reach("before_marks", record.epoch)
            mark_replayed(self.table, spans, self._query_id(), record.epoch)

    def _query_id(self) -> str:
        query_id = self._store.query_id() if self._store is not None else None
        if not query_id:
            raise RegionalStoreError("source=deadLetters: the replay's regional store has no query id yet")
        return query_id

    def _open(self) -> Any:
        table = open_table(self.table)
        if table is None:
            raise RegionalStoreError(f"source=deadLetters: the dead-letter table {self.table} is gone; restore it")
        return table

    # -- in the task -----------------------------------------------------------------------------

    def read(self, region: str, start: int, end: int, split: DeadLetterSplit,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        table = open_table(self.table, split.version)
        if table is None:
            raise RegionalStoreError(f"source=deadLetters: the dead-letter table {self.table} is gone; restore it")
        # Records another replay marked are not read; this one's own marks are (a re-run of a recorded epoch).
        mine = (f" AND ({REPLAYED_BY} IS NULL OR {REPLAYED_BY} = {sql_text(split.query_id)})"
                if REPLAYED_BY in table_columns(table) else "")
        columns = ", ".join(sql_name(n) for n in self.schema.names)
        rows = query_table(table, f'SELECT {columns} FROM {DEAD_LETTER_TABLE} WHERE region = {sql_text(region)} '
                                  f'AND "offset" >= {int(start)} AND "offset" < {int(end)}{mine} ORDER BY "offset"')
        yield from rows.cast(self.schema).to_batches(max_chunksize=batch_rows)


def mark_replayed(location: Location, spans: list[tuple[str, int, int]], query_id: str, epoch: int) -> None:
    """Mark the records of ``spans`` (region, start, end) that no replay has marked yet: replayed by ``query_id``
    in ``epoch``. Idempotent: a record marked already is left as it is."""
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError

    for i in range(0, len(spans), MARK_REGIONS_PER_UPDATE):
        chunk = spans[i:i + MARK_REGIONS_PER_UPDATE]
        where = " OR ".join(f'(region = {sql_text(r)} AND "offset" >= {int(s)} AND "offset" < {int(e)})'
                            for r, s, e in chunk)
        for attempt in range(MARK_TRIES):
            table = open_table(location)
            if table is None:
                raise RegionalStoreError(f"source=deadLetters: the dead-letter table {location} is gone; restore it")
            _add_mark_columns(table)
            try:
                table.update(updates={REPLAYED_BY: sql_text(query_id), REPLAYED_EPOCH: str(int(epoch))},
                             predicate=f"{REPLAYED_BY} IS NULL AND ({where})",
                             commit_properties=CommitProperties(custom_metadata={
                                 "regional": {"replayed_by": query_id, "epoch": int(epoch)}}))
                break
            except CommitFailedError:  # the table's writer committed first: read it again and retry
                if attempt == MARK_TRIES - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))


def _add_mark_columns(table: Any) -> None:
    from deltalake import Field
    from deltalake.exceptions import DeltaError
    from deltalake.schema import PrimitiveType

    names = table_columns(table)
    missing = [Field(name, PrimitiveType(kind), nullable=True)
               for name, kind in ((REPLAYED_BY, "string"), (REPLAYED_EPOCH, "long")) if name not in names]
    if not missing:
        return
    try:
        table.alter.add_columns(missing)
    except DeltaError:  # another replay added them first
        table.update_incremental()
        if any(n not in table_columns(table) for n in REPLAY_COLUMNS):
            raise


def sql_name(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def plain_type(f: pa.Field) -> pa.Field:
    """Delta's reader may hand out view or large types; the source offers Spark the plain ones."""
    return f.with_type(_plain(f.type))


def _plain(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(kind) or pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_binary_view(kind) or pa.types.is_large_binary(kind):
        return pa.binary()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        return pa.list_(plain_type(kind.value_field))
    if pa.types.is_struct(kind):
        return pa.struct([plain_type(kind.field(i)) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):
        return pa.map_(_plain(kind.key_type), _plain(kind.item_type))
    return kind


_SPARK_TYPES = {pa.string(): "STRING", pa.binary(): "BINARY", pa.bool_(): "BOOLEAN", pa.int8(): "TINYINT",
                pa.int16(): "SMALLINT", pa.int32(): "INT", pa.int64(): "BIGINT", pa.float32(): "FLOAT",
                pa.float64(): "DOUBLE", pa.date32(): "DATE"}


def spark_ddl(schema: pa.Schema) -> str:
    """The Spark DDL of an Arrow schema (the types a dead-letter table can hold)."""
    return ", ".join(f"{_ddl_name(f.name)} {_spark_type(f.type, f.name)}" for f in schema)


def _ddl_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _spark_type(kind: pa.DataType, name: str) -> str:
    if kind in _SPARK_TYPES:
        return _SPARK_TYPES[kind]
    if pa.types.is_timestamp(kind):
        return "TIMESTAMP" if kind.tz else "TIMESTAMP_NTZ"
    if pa.types.is_decimal(kind):
        return f"DECIMAL({kind.precision}, {kind.scale})"
    if pa.types.is_list(kind):
        return f"ARRAY<{_spark_type(kind.value_type, name)}>"
    if pa.types.is_map(kind):
        return f"MAP<{_spark_type(kind.key_type, name)}, {_spark_type(kind.item_type, name)}>"
    if pa.types.is_struct(kind):
        fields = (kind.field(i) for i in range(kind.num_fields))
        return "STRUCT<" + ", ".join(f"{_ddl_name(f.name)}: {_spark_type(f.type, name)}" for f in fields) + ">"
    raise RegionalConfigError(f"source=deadLetters: column {name!r} of the dead-letter table is {kind}, a type "
                              "the replay cannot hand to Spark")
