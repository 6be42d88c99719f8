"""Dead letters (``deadLetterPath``): the records isolated as poison, as rows for their sink.

A record whose one-record range failed upstream of the sink on every attempt is *dead-lettered*: the task's
quarantined attempt reads it from the source (it is never handed to the query's code) and returns it in its
commit message (``encode_records``); the driver's phase two (``regional.coordinator``) turns it into the
dead-letter sink's rows (``dead_letter_rows``): the source's own columns (``region``, ``offset``, then
``value``; Kafka's ``key``, ``topic``, ``partition``, ``timestamp``, ...), then ``epoch`` and ``error``
(the exception's class and message). The sink is a target (``regional.targets.dead_letter_target``).

A replay (``source=deadLetters``, ``regional.inputs.deadletters``) reads them back and marks each record it
replayed in the table itself (``REPLAY_COLUMNS``: which query, which epoch); ``summary`` is what
``python -m regional dead-letters`` prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from regional.errors import RegionalConfigError, RegionalPlanError
from regional.location import Location, parse_location
from regional.storage.config import delta_options

DEAD_LETTER_COLUMNS = ("epoch", "error")
REPLAYED_BY, REPLAYED_EPOCH, REPLAYED_AS = "replayed_by", "replayed_epoch", "replayed_as"
REPLAY_COLUMNS = (REPLAYED_BY, REPLAYED_EPOCH, REPLAYED_AS)  # added to a dead-letter table by its first replay
PUBLISHED, DEAD_LETTERED = "published", "dead-lettered"  # what replayed_as says: the replay's outcome
DEAD_LETTER_TABLE = "dead_letters"  # the table's name in the SQL that reads it


def encode_records(batches: list[pa.RecordBatch], schema: pa.Schema) -> bytes:
    """Records as the source read them, for a task's commit message (Arrow IPC stream)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_records(payload: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(payload)).read_all()


def dead_letter_rows(payload: bytes, region: str, offset: int, epoch: int, error: str) -> pa.Table:
    """The dead-letter sink's rows for one isolated record: checked to be that record of that region."""
    records = decode_records(payload)
    names = records.schema.names
    clash = [c for c in DEAD_LETTER_COLUMNS if c in names]
    if clash:
        raise RegionalConfigError(f"the source has columns {clash}, which the dead-letter table adds itself")
    regions = records.column("region").to_pylist() if "region" in names else []
    offsets = records.column("offset").to_pylist() if "offset" in names else []
    n = records.num_rows
    if n < 1 or set(regions) != {region} or offsets != list(range(offset, offset + n)):
        raise RegionalPlanError(f"the dead letter of region {region!r} at offset {offset} arrived as {n} row(s) of "
                                f"regions {sorted(set(map(str, regions)))[:3]}, offsets {offsets[:3]}")
    # region and offset first, wherever the source has them (Kafka's are Spark's offset and a last region): a
    # dead-letter table's columns stay region, offset, the source's others, epoch, error.
    records = records.select(["region", "offset", *(c for c in names if c not in ("region", "offset"))])
    return (records.append_column("epoch", pa.array([epoch] * n, pa.int64()))
            .append_column("error", pa.array([error] * n, pa.string())))


_ERROR_CLASS = re.compile(r"^\s*([A-Za-z_][\w.$]*)\s*:")


def error_class(error: str | None) -> str:
    """The exception's class of a dead letter's ``error`` ("ValueError: bad record" -> "ValueError")."""
    found = _ERROR_CLASS.match(error or "")
    return found.group(1) if found else "unknown"


@dataclass
class RegionLetters:
    records: int = 0
    waiting: int = 0  # not replayed yet
    oldest: tuple[int, int] | None = None  # (epoch, offset)
    newest: tuple[int, int] | None = None

    def add(self, epoch: int, offset: int, replayed: bool) -> None:
        self.records += 1
        self.waiting += not replayed
        self.oldest = min(self.oldest or (epoch, offset), (epoch, offset))
        self.newest = max(self.newest or (epoch, offset), (epoch, offset))


@dataclass
class DeadLetterSummary:
    """A dead-letter table (or topic) at a glance: counts by region and by error class, the oldest and newest
    letters."""

    table: str  # the table's location, or kafka:<topic>
    version: int | None  # the table's version read; None for a topic
    records: int = 0
    replayed: int = 0
    regions: dict[str, RegionLetters] = field(default_factory=dict)
    error_classes: dict[str, int] = field(default_factory=dict)
    oldest: dict[str, Any] | None = None  # epoch, region, offset, error
    newest: dict[str, Any] | None = None

    def add(self, region: str, offset: int, epoch: int, error: str, replayed: bool) -> None:
        """One letter (``epoch`` -1: a row not written by regional's dead-letter sink)."""
        self.records += 1
        self.replayed += replayed
        self.regions.setdefault(region, RegionLetters()).add(epoch, offset, replayed)
        kind = error_class(error)
        self.error_classes[kind] = self.error_classes.get(kind, 0) + 1
        letter = {"epoch": epoch, "region": region, "offset": offset, "error": error}
        if self.oldest is None or (epoch, offset) < (self.oldest["epoch"], self.oldest["offset"]):
            self.oldest = letter
        if self.newest is None or (epoch, offset) > (self.newest["epoch"], self.newest["offset"]):
            self.newest = letter

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "version": self.version, "records": self.records, "replayed": self.replayed,
                "waiting": self.records - self.replayed,
                "by_region": {r: {"records": g.records, "waiting": g.waiting,
                                  "oldest": _point(g.oldest), "newest": _point(g.newest)}
                              for r, g in sorted(self.regions.items())},
                "by_error_class": dict(sorted(self.error_classes.items(), key=lambda kv: (-kv[1], kv[0]))),
                "oldest": self.oldest, "newest": self.newest}


def _point(at: tuple[int, int] | None) -> dict[str, int] | None:
    return None if at is None else {"epoch": at[0], "offset": at[1]}


def summary(path: str) -> DeadLetterSummary:
    """Read the dead-letter table at ``path`` (local or an object store) and summarise it."""
    location = parse_location("table", path)
    table = open_table(location)
    if table is None:
        raise RegionalConfigError(f"there is no Delta table at {location}: a dead-letter table is created by its "
                                  "query's first dead letter (deadLetterPath)") from None
    names = table_columns(table)
    missing = [c for c in ("region", "offset", *DEAD_LETTER_COLUMNS) if c not in names]
    if missing:
        raise RegionalConfigError(f"the Delta table at {location} is not a regional dead-letter table: it has no "
                                  f"column(s) {missing}")
    # Through delta-rs's DataFusion: pyarrow's dataset reader of delta-rs tables aborts at exit (pyarrow 22).
    marked = f", {REPLAYED_BY}" if REPLAYED_BY in names else ""
    rows = query_table(table, f'SELECT region, "offset", epoch, error{marked} FROM {DEAD_LETTER_TABLE}').to_pydict()
    out = DeadLetterSummary(str(location), table.version())
    replays = rows.get(REPLAYED_BY) or [None] * len(rows["region"])
    for region, offset, epoch, error, by in zip(rows["region"], rows["offset"], rows["epoch"], rows["error"],
                                                replays, strict=True):
        out.add(str(region), int(offset), -1 if epoch is None else int(epoch), error, by is not None)
    return out


def open_table(location: Location, version: int | None = None) -> Any:
    """The Delta table at ``location`` (at ``version``), or None when there is none."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(str(location), version=version, storage_options=delta_options(location))
    except TableNotFoundError:
        return None


def table_columns(table: Any) -> list[str]:
    return [f.name for f in table.schema().fields]


def query_table(table: Any, sql: str) -> pa.Table:
    """``sql`` over the table (named ``dead_letters``), through delta-rs's DataFusion. Not pyarrow's dataset:
    delta-rs rewrites files with view types on UPDATE, which pyarrow 22 cannot filter, and its reader of a
    delta-rs table often aborts the process at exit ("terminate called without an active exception")."""
    from deltalake import QueryBuilder

    reader = QueryBuilder().register(DEAD_LETTER_TABLE, table).execute(sql)
    return pa.RecordBatchReader.from_stream(reader).read_all()


def sql_text(value: str) -> str:
    """A SQL string literal: region ids and query ids come from the outside world."""
    return "'" + str(value).replace("'", "''") + "'"
