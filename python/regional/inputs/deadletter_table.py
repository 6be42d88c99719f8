"""``source=deadLetters``, ``path=<dead-letter table>``: replay the records a query dead-lettered.

A dead-letter table (``deadLetterPath``, ``regional.dead_letters``) holds each record isolated as poison as its
source read it (``region``, ``offset``, the source's own columns), then ``epoch`` and ``error``. This source reads
them back as that source's records: the same columns, regions and offsets. So the query that failed on them runs
again unchanged (the same select, into the same target) with every regional guarantee, and writes what the first
query would have written. A record that fails again goes to the replay's own ``deadLetterPath``.

- Offsets: a region's records keep their original offsets, a sparse log (like a compacted topic). Its query
  dead-letters a region's records in offset order, as it moves on, so the table grows in that order too.
- Marks: after each recorded epoch (``on_recorded``: in the sink's phase two, right after the record, and in the
  reader before its next plan) the rows that epoch's tasks read and published, or dead-lettered again, are marked
  in the table itself: ``replayed_by`` (the replay's query id), ``replayed_epoch`` and ``replayed_as`` (one
  Delta transaction per outcome; the columns are added by the first replay, and the table's writer leaves them
  null). The tasks of an epoch read the table at one version, kept in the store (``before_splits``), so the marks
  cover exactly what they read. A replay reads no record another replay marked, nor its own dead-lettered again
  (its probes would fail on them): a second replay of the same table takes only what is new. One record
  dead-lettered twice is read once. The offsets are sparse: a record isolated as poison is probed with every
  record of its region before and after it (``sparse``).
- A record that reaches the table below where this replay already is (two queries share the table, or its query
  started again from earlier offsets) would never be read: the replay fails, saying so, rather than skip it.

Where each method runs: ``available``, ``before_splits``, ``split`` and ``on_recorded`` on the driver (the reader's
process; ``on_recorded`` also in the sink's, built from ``phase_two_options``); ``read`` in the task, which reads
the table through delta-rs's DataFusion at the version kept for its epoch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from regional import failpoints
from regional.dead_letters import (
    DEAD_LETTER_COLUMNS,
    DEAD_LETTER_TABLE,
    DEAD_LETTERED,
    PUBLISHED,
    REPLAY_COLUMNS,
    REPLAYED_AS,
    REPLAYED_BY,
    REPLAYED_EPOCH,
    open_table,
    query_table,
    sql_text,
    table_columns,
)
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.inputs.base import BATCH_ROWS, AcknowledgingInput, RegionInput, StoredInput
from regional.inputs.deadletter_rows import plain_type, spark_ddl, sql_name
from regional.location import Location, parse_location
from regional.options import Option, OptionTable
from regional.store.model import EpochRecord

if TYPE_CHECKING:
    from regional.store import Store
    from regional.store.source_log import SourceLog

log = logging.getLogger("regional")

MARK_REGIONS_PER_UPDATE = 500  # regions per query of the rows an epoch read: its predicate names each
MARK_ROWS_PER_UPDATE = 2000  # records per marking UPDATE: its predicate names each
KEPT_VERSIONS = 4  # the table versions of the last few epochs, kept in the store
MARK_TRIES = 5  # a marking UPDATE that lost a race with the table's writer (a Delta conflict) is tried again


_REPLAY = "a replay reads every record of the table that no replay has marked"
OPTIONS = OptionTable("source=deadLetters (a dead-letter table)", [
    Option("path", "required", "The dead-letter table to replay: the `deadLetterPath` of the query whose dead "
                               "letters to replay (or `.load(path)`)."),
    Option("startingVersion", "", "", refused=_REPLAY, stock=True),
    Option("startingTimestamp", "", "", refused=_REPLAY, stock=True),
    Option("maxFilesPerTrigger", "", "", refused="use maxRecordsPerTrigger or maxRecordsPerRegion", stock=True),
    Option("maxBytesPerTrigger", "", "", refused="use maxRecordsPerTrigger or maxRecordsPerRegion", stock=True),
    Option("readChangeFeed", "", "", refused=_REPLAY, stock=True),
    Option("skipChangeCommits", "", "", refused="the replay's own marks are changes it reads past", stock=True),
    Option("ignoreDeletes", "", "", refused="a dead letter deleted before its replay is not replayed", stock=True),
    Option("ignoreChanges", "", "", refused="the replay's own marks are changes it reads past", stock=True),
])


@dataclass(frozen=True)
class DeadLetterSplit:
    """What a task needs to read a range: the table's version planned against, and whose marks it may read."""

    version: int
    query_id: str


class DeadLetterInput(RegionInput[DeadLetterSplit], StoredInput, AcknowledgingInput):
    schema: pa.Schema
    schema_ddl: str
    sparse = True  # the original offsets: a poison record is probed with every record of its region around it

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
        self._log: SourceLog | None = None
        self._versions: dict[int, int] | None = None  # epoch -> the table's version its tasks read (the last few)
        self._split_version: int | None = None  # the version of the epoch whose splits are being made
        self._committed: dict[str, int] = {}  # each region's committed offset, as of the last recorded epoch

    def table_location(self) -> str:
        return str(self.table)

    def use_store(self, store: Store) -> None:
        self._store = store
        self._log = store.source_log("deadletters")

    # -- on the driver ---------------------------------------------------------------------------

    def available(self, epoch: int) -> dict[str, int]:
        table = self._open()
        marked = REPLAYED_BY in table_columns(table)
        marks_column = f", {REPLAYED_BY}" if marked else ""
        rows = query_table(table, f'SELECT region, "offset"{marks_column} FROM {DEAD_LETTER_TABLE}')
        regions, offsets = rows.column("region").to_pylist(), rows.column("offset").to_pylist()
        marks = rows.column(REPLAYED_BY).to_pylist() if marked else [None] * len(regions)
        ends: dict[str, int] = {}
        late: list[tuple[str, int]] = []
        replayed: set[tuple[str, int]] = set()
        for region, offset, by in zip(regions, offsets, marks, strict=True):
            ends[region] = max(ends.get(region, 0), offset + 1)
            if by is None and offset < self._committed.get(region, 0):
                late.append((region, offset))
            elif by is not None:
                replayed.add((region, offset))
        if late:
            region, offset = min(late)
            again = [k for k in late if k in replayed]
            raise RegionalStoreError(
                f"source=deadLetters: {len(late)} record(s) reached the dead-letter table {self.table} after this "
                f"replay had passed their offsets (e.g. region {region!r} at offset {offset}, below its committed "
                f"offset {self._committed[region]}): two queries share the table, or its query started again from "
                "earlier offsets. This replay would never read them. "
                + (f"{len(again)} of them (e.g. region {again[0][0]!r} at offset {again[0][1]}) have the region "
                   "and offset of a record already replayed: the same record dead-lettered twice; delete those rows "
                   "from the table rather than replay them again. " if again else "")
                + "Replay the rest with a new checkpointLocation (it takes only records no replay has marked)")
        return ends

    def phase_two_options(self) -> dict[str, str]:
        """The marks are made in the sink's phase two too: the table's location is all it takes (no secret)."""
        return {"source": "deadLetters", "path": str(self.table)}

    def before_splits(self, epoch: int) -> None:
        """The epoch's tasks read the table at one version, kept in the store: a restart's re-run reads the same
        rows, and the marks after the epoch cover exactly the rows it read, not one that arrived since."""
        versions = self._load_versions()
        version = versions.get(epoch)
        if version is None:
            version = self._open().version()
            versions[epoch] = version
            for old in sorted(versions)[:-KEPT_VERSIONS]:
                del versions[old]
            assert self._log is not None
            self._log.write_snapshot({"versions": {str(e): v for e, v in versions.items()}})
        self._split_version = version

    def split(self, region: str, start: int, end: int) -> DeadLetterSplit:
        if self._split_version is None:
            raise RegionalStoreError("source=deadLetters: split() before before_splits(): a reader bug")
        return DeadLetterSplit(self._split_version, self._query_id())

    def on_recorded(self, record: EpochRecord) -> None:
        """Mark what ``record`` published or dead-lettered again as replayed by this query in that epoch: the rows
        its tasks read, at the version they read."""
        self._committed = {r: s.committed_offset for r, s in record.regions.items()}
        published = sorted((r, s.start, s.end) for r, s in record.committed.items())
        dead = sorted((r, d.offset, d.offset + d.count) for r, d in record.dead_lettered.items())
        if not (published or dead):
            return
        version = self._load_versions().get(record.epoch)
        if version is None:  # planned by a regional without versions: the table as it is now
            log.warning("regional: source=deadLetters: no table version kept for epoch %d; marking its ranges in "
                        "the table as it is now", record.epoch)
        failpoints.reach("before_marks", record.epoch)
        mark_replayed(self.table, version, published, dead, self._query_id(), record.epoch)

    def _load_versions(self) -> dict[int, int]:
        if self._versions is None:
            assert self._log is not None, "use_store() first"
            loaded = self._log.load()  # snapshots only: each holds the last few epochs' versions
            state = loaded[0] if loaded else {"versions": {}}
            self._versions = {int(e): int(v) for e, v in state["versions"].items()}
        return self._versions

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
        # Records another replay marked are not read. This one's own published records are (its probes read them,
        # and a re-run of a recorded epoch); its own dead-lettered again are not (a probe would fail on them).
        mine = (f" AND ({REPLAYED_BY} IS NULL OR ({REPLAYED_BY} = {sql_text(split.query_id)} AND {REPLAYED_AS} = "
                f"{sql_text(PUBLISHED)}))" if REPLAYED_AS in table_columns(table) else "")
        columns = ", ".join(sql_name(n) for n in self.schema.names)
        rows = query_table(table, f'SELECT {columns} FROM {DEAD_LETTER_TABLE} WHERE region = {sql_text(region)} '
                                  f'AND "offset" >= {int(start)} AND "offset" < {int(end)}{mine} ORDER BY "offset"')
        rows = rows.cast(self.schema)  # plain types (DataFusion hands out views), which every kernel takes
        offsets = rows.column("offset").to_numpy()
        if len(offsets) > 1 and (offsets[1:] == offsets[:-1]).any():  # one record dead-lettered twice: read once
            rows = rows.filter(pa.array(np.concatenate([[True], offsets[1:] != offsets[:-1]])))
        yield from rows.to_batches(max_chunksize=batch_rows)


def mark_replayed(location: Location, version: int | None, published: list[tuple[str, int, int]],
                  dead: list[tuple[str, int, int]], query_id: str, epoch: int) -> None:
    """Mark the records of the spans (region, start, end) that the epoch read (at ``version``; None: as the table
    is now) and no replay has marked yet: replayed by ``query_id`` in ``epoch``, as ``published`` or dead-lettered
    again. Idempotent: a record marked already is left as it is."""
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError

    read = _rows_read(location, version, published + dead, query_id)
    for outcome, spans in ((PUBLISHED, published), (DEAD_LETTERED, dead)):
        keys = [(r, o) for r, s, e in spans for o in read.get(r, ()) if s <= o < e]
        for i in range(0, len(keys), MARK_ROWS_PER_UPDATE):
            by_region: dict[str, list[int]] = {}
            for r, o in keys[i:i + MARK_ROWS_PER_UPDATE]:
                by_region.setdefault(r, []).append(o)
            where = " OR ".join(f'(region = {sql_text(r)} AND "offset" IN ({", ".join(map(str, sorted(set(os))))}))'
                                for r, os in sorted(by_region.items()))
            for attempt in range(MARK_TRIES):
                table = open_table(location)
                if table is None:
                    raise RegionalStoreError(f"source=deadLetters: the dead-letter table {location} is gone; "
                                             "restore it")
                _add_mark_columns(table)
                try:
                    table.update(updates={REPLAYED_BY: sql_text(query_id), REPLAYED_EPOCH: str(int(epoch)),
                                          REPLAYED_AS: sql_text(outcome)},
                                 predicate=f"{REPLAYED_BY} IS NULL AND ({where})",
                                 commit_properties=CommitProperties(custom_metadata={
                                     "regional": {"replayed_by": query_id, "epoch": int(epoch)}}))
                    break
                except CommitFailedError:  # the table's writer committed first: read it again and retry
                    if attempt == MARK_TRIES - 1:
                        raise
                    time.sleep(0.2 * (attempt + 1))


def _rows_read(location: Location, version: int | None, spans: list[tuple[str, int, int]],
               query_id: str) -> dict[str, list[int]]:
    """The offsets of each region's rows in ``spans`` as the epoch's tasks read them (at ``version``)."""
    table = open_table(location, version)
    if table is None:
        raise RegionalStoreError(f"source=deadLetters: the dead-letter table {location} (version {version}) is "
                                 "gone; restore it")
    mine = (f" AND ({REPLAYED_BY} IS NULL OR {REPLAYED_BY} = {sql_text(query_id)})"
            if REPLAYED_BY in table_columns(table) else "")
    read: dict[str, list[int]] = {}
    for i in range(0, len(spans), MARK_REGIONS_PER_UPDATE):
        where = " OR ".join(f'(region = {sql_text(r)} AND "offset" >= {int(s)} AND "offset" < {int(e)})'
                            for r, s, e in spans[i:i + MARK_REGIONS_PER_UPDATE])
        rows = query_table(table, f'SELECT region, "offset" FROM {DEAD_LETTER_TABLE} WHERE ({where}){mine}')
        for region, offset in zip(rows.column("region").to_pylist(), rows.column("offset").to_pylist(), strict=True):
            read.setdefault(region, []).append(int(offset))
    return read


def _add_mark_columns(table: Any) -> None:
    from deltalake import Field
    from deltalake.exceptions import DeltaError
    from deltalake.schema import PrimitiveType

    names = table_columns(table)
    missing = [Field(name, PrimitiveType(kind), nullable=True)
               for name, kind in ((REPLAYED_BY, "string"), (REPLAYED_EPOCH, "long"), (REPLAYED_AS, "string"))
               if name not in names]
    if not missing:
        return
    try:
        table.alter.add_columns(missing)
    except DeltaError:  # another replay added them first
        table.update_incremental()
        if any(n not in table_columns(table) for n in REPLAY_COLUMNS):
            raise
