"""An exactly-once checker: compares what landed in a target with the input, record by record.

``check(expected, landed)`` takes each region's input records ``(offset, value)`` in input order and the
rows a target holds, each with the position at which it was published (a Delta version, a PostgreSQL
transaction id, an epoch: anything that orders publications). It reports

- **lost**: an input record that is not in the target (with ``complete=False``, only a record before
  another of its region that did land: a query stopped mid-run may not have published its tail yet);
- **duplicated**: a record that landed more than once;
- **out of order**: a record published before one that comes earlier in its region's input (nothing may
  be published past a gap, and a region's publications follow its input);
- **wrong**: a record that landed with a value other than its input's, or that is not in the input.

Readers turn each target into ``Landed`` rows: ``delta_landed`` (a Delta table's log, version by version),
``postgres_landed`` (a table's rows, ordered by the transaction that wrote them), ``epoch_files_landed``
(a committer that publishes one file per epoch) and ``kafka_landed`` (a topic whose records say their region and
offset in headers, each region keyed to one partition). Used by the integration tests and the reliability
campaign (``python -m reliability.run``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

Key = tuple[str, int]  # (region, offset)


@dataclass(frozen=True)
class Landed:
    """One row in a target: its record and where it was published (smaller ``published`` came first)."""

    region: str
    offset: int
    value: Any
    published: int


@dataclass
class Report:
    expected: int
    landed: int
    lost: list[Key] = field(default_factory=list)
    duplicated: list[Key] = field(default_factory=list)
    out_of_order: list[Key] = field(default_factory=list)
    wrong: list[tuple[Key, Any, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.out_of_order or self.wrong)

    def summary(self) -> str:
        return (f"{self.expected} input records, {self.landed} rows landed: {len(self.lost)} lost, "
                f"{len(self.duplicated)} duplicated, {len(self.out_of_order)} out of order, {len(self.wrong)} wrong")

    def explain(self, limit: int = 10) -> str:
        parts = [self.summary()]
        for name in ("lost", "duplicated", "out_of_order", "wrong"):
            items = getattr(self, name)
            if items:
                parts.append(f"{name}: {sorted(items, key=repr)[:limit]}")
        return "\n".join(parts)

    def assert_ok(self) -> None:
        assert self.ok, self.explain()


def check(expected: Mapping[str, Sequence[tuple[int, Any]]], landed: Iterable[Landed],
          complete: bool = True) -> Report:
    """Compare ``landed`` with ``expected`` (each region's records in input order; offsets need not be
    contiguous). With ``complete=False`` a region may lack a tail of its input."""
    rows = list(landed)
    report = Report(expected=sum(len(v) for v in expected.values()), landed=len(rows))
    want = {(r, o): v for r, records in expected.items() for o, v in records}
    position = {(r, o): i for r, records in expected.items() for i, (o, _) in enumerate(records)}

    first: dict[Key, Landed] = {}
    for row in rows:
        key = (row.region, row.offset)
        if key in first:
            report.duplicated.append(key)
            continue
        first[key] = row
        if key not in want:
            report.wrong.append((key, row.value, None))
        elif row.value != want[key]:
            report.wrong.append((key, row.value, want[key]))

    for region, records in expected.items():
        held = [i for i, (o, _) in enumerate(records) if (region, o) in first]
        through = (max(held) + 1) if held else 0  # a stopped query may lack what follows its last landed record
        end = len(records) if complete else through
        report.lost.extend((region, o) for o, _ in records[:end] if (region, o) not in first)
        # publication order must follow input order: sort this region's rows by (published, input position)
        published = sorted((first[(region, o)].published, position[(region, o)], o)
                           for o, _ in records if (region, o) in first)
        latest = -1
        for _, index, offset in published:
            if index < latest:
                report.out_of_order.append((region, offset))
            latest = max(latest, index)
    report.duplicated = sorted(set(report.duplicated))
    return report


def delta_landed(table: str | Path, columns: Sequence[str] = ("region", "offset", "value")) -> list[Landed]:
    """A Delta table's rows, each with the version whose commit added its file, read from the JSON commits in
    ``_delta_log`` (a table whose old commits were cleaned up cannot be checked this way). The table may be on
    any storage regional reaches (``s3a://...``, with the storage settings of this process)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from regional.location import parse_location
    from regional.storage import open_storage

    storage = open_storage(parse_location("table", str(table)))
    rows: list[Landed] = []
    removed: set[str] = set()
    added: list[tuple[int, str]] = []
    commits = sorted(i.name for i in storage.list("_delta_log") if i.name.endswith(".json"))
    for name in commits:
        version = int(name.rsplit("/", 1)[-1].split(".")[0])
        for line in (storage.read(name) or b"").decode().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                added.append((version, action["add"]["path"]))
            elif "remove" in action:
                removed.add(action["remove"]["path"])
    for version, path in added:
        if path in removed:
            continue
        raw = storage.read(unquote(path))
        if raw is None:
            raise AssertionError(f"the table's version {version} adds {path}, which is not in {storage.describe()}")
        data = pq.read_table(pa.BufferReader(raw), columns=list(columns))
        region, offset, value = (data.column(c).to_pylist() for c in columns)
        rows.extend(Landed(r, o, v, version) for r, o, v in zip(region, offset, value, strict=True))
    return rows


def postgres_landed(conn: Any, table: str, columns: Sequence[str] = ("region", "offset", "value")) -> list[Landed]:
    """A PostgreSQL table's rows, each with the id of the transaction that wrote it. Regional writes each
    region's slice of an epoch in one prepared transaction, and an epoch's transactions begin after the
    previous epoch's committed, so within a region transaction ids follow the publications."""
    from psycopg import sql

    query = sql.SQL("SELECT {}, xmin::text::bigint FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns), sql.Identifier(*table.split(".")))
    return [Landed(r, int(o), v, int(x)) for r, o, v, x in conn.execute(query).fetchall()]


def epoch_files_landed(directory: str | Path) -> list[Landed]:
    """Rows of ``regional.testing.committer.EpochFilesTarget``: one JSON lines file per epoch and region,
    named ``<epoch>-<region>.jsonl``."""
    rows: list[Landed] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        epoch = int(path.name.split("-", 1)[0])
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows.append(Landed(row["region"], int(row["offset"]), row["value"], epoch))
    return rows


def kafka_landed(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Landed]:
    """A topic's records as a consumer with ``isolation`` reads them, each naming its input in the headers
    ``region`` and ``offset``; ``published`` is the record's offset in its partition (a region's records go to one
    partition: keyed by the region). A record without those headers lands as region ``?``: wrong."""
    from regional.testing.kafka_broker import topic_messages

    rows = []
    for m in topic_messages(bootstrap, topic, isolation):
        headers = dict(m["headers"])
        rows.append(Landed((headers.get("region") or b"?").decode(), int(headers.get("offset") or -1),
                           m["value"].decode() if m["value"] is not None else None, int(m["offset"] or 0)))
    return rows
