"""The dead-letter source (``source=deadLetters``) and ``python -m regional dead-letters`` over real Delta tables on
disk, written as the coordinator writes them (the dead-letter target's prepare and commit, on the driver)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from regional.dead_letters import (
    REPLAY_COLUMNS,
    dead_letter_rows,
    encode_records,
    error_class,
    open_table,
    query_table,
    sql_text,
    summary,
)
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.inputs import load_input
from regional.inputs.deadletters import DeadLetterInput, spark_ddl
from regional.inputs.files import SCHEMA as FILES_SCHEMA
from regional.inputs.kafka import SCHEMA_WITH_HEADERS as KAFKA_SCHEMA
from regional.location import parse_location
from regional.store import Store
from regional.store.model import DeadLetter, EpochKind, EpochRecord, RegionState, Slice
from regional.targets import dead_letter_target

ODD = "it's \"odd\""  # a region id SQL must quote


def dead_letter(table: str, epoch: int, region: str, offset: int, value: str, error: str = "ValueError: bad",
                query_id: str = "original") -> None:
    """One dead letter, into the table as the coordinator puts it there (steps 4 and 5)."""
    batch = pa.RecordBatch.from_pydict({"region": [region], "offset": [offset], "value": [value]}, FILES_SCHEMA)
    rows = dead_letter_rows(encode_records([batch], FILES_SCHEMA), region, offset, epoch, error)
    sink = dead_letter_target(table, query_id)
    sink.commit(epoch, {region: sink.prepare(epoch, region, iter(rows.to_batches()))})


def replay(table: str, checkpoint: Path) -> DeadLetterInput:
    """The replay source of a query whose store is at ``checkpoint`` (its query id names its marks)."""
    source = load_input({"source": "deadLetters", "path": table})
    assert isinstance(source, DeadLetterInput)
    store = Store(str(checkpoint))
    store.open_query()
    source.use_store(store)
    return source


def read_all(source: DeadLetterInput, region: str, start: int, end: int, epoch: int = 0) -> list[tuple[str, int, str]]:
    source.before_splits(epoch)
    split = source.split(region, start, end)
    return [(r["region"], r["offset"], r["value"])
            for b in source.read(region, start, end, split) for r in b.to_pylist()]


def recorded(epoch: int, committed: dict[str, tuple[int, int]], dead: dict[str, int] | None = None) -> EpochRecord:
    regions = {r: RegionState(e, epoch) for r, (_s, e) in committed.items()}
    regions.update({r: RegionState(o + 1, epoch) for r, o in (dead or {}).items()})
    return EpochRecord(epoch, EpochKind.GLOBAL, {r: Slice(s, e, e - s) for r, (s, e) in committed.items()}, {},
                       regions, dead_lettered={r: DeadLetter(o, "ValueError: bad") for r, o in (dead or {}).items()})


def test_a_replay_reads_the_original_regions_and_offsets_and_marks_what_it_replayed(tmp_path):
    table = str(tmp_path / "dlq")
    dead_letter(table, 3, "a", 17, "a-17")
    dead_letter(table, 5, ODD, 4, "odd-4")
    dead_letter(table, 9, "a", 41, "a-41", "KeyError: 'x'")
    source = replay(table, tmp_path / "ck1")
    q1 = source._query_id()
    assert source.schema == FILES_SCHEMA and source.schema_ddl == "`region` STRING, `offset` BIGINT, `value` STRING"
    assert source.available(0) == {"a": 42, ODD: 5}
    assert read_all(source, "a", 0, 42) == [("a", 17, "a-17"), ("a", 41, "a-41")]
    assert read_all(source, "a", 18, 42) == [("a", 41, "a-41")]
    assert read_all(source, ODD, 0, 5) == [(ODD, 4, "odd-4")]

    source.on_recorded(recorded(0, {"a": (0, 42)}, dead={ODD: 4}))
    source.on_recorded(recorded(0, {"a": (0, 42)}, dead={ODD: 4}))  # at least once: a second time changes nothing
    found = summary(table)
    assert (found.records, found.replayed, found.error_classes) == (3, 3, {"ValueError": 2, "KeyError": 1})
    assert marks_of(table) == [("a", 17, q1, 0, "published"), ("a", 41, q1, 0, "published"),
                               (ODD, 4, q1, 0, "dead-lettered")]
    assert read_all(source, "a", 0, 42, epoch=1) == [("a", 17, "a-17"), ("a", 41, "a-41")]  # own published: read
    assert read_all(source, ODD, 0, 5, epoch=1) == []  # its own dead-lettered again: never (a probe would fail)

    # A second replay (another query) takes only what is new.
    again = replay(table, tmp_path / "ck2")
    assert read_all(again, "a", 0, 42, epoch=0) == []
    dead_letter(table, 12, "a", 50, "a-50")  # the original query goes on: its dead-letter table takes the marks
    assert again.available(1) == {"a": 51, ODD: 5}
    assert read_all(again, "a", 0, 51, epoch=1) == [("a", 50, "a-50")]
    assert summary(table).to_json()["by_region"]["a"] == {"records": 3, "waiting": 1, "oldest": {
        "epoch": 3, "offset": 17}, "newest": {"epoch": 12, "offset": 50}}


def marks_of(table: str) -> list[tuple]:
    rows = query_table(open_table(parse_location("t", table)), 'SELECT region, "offset", replayed_by, replayed_epoch, '
                       'replayed_as FROM dead_letters ORDER BY region, "offset"').to_pylist()
    return [(m["region"], m["offset"], m["replayed_by"], m["replayed_epoch"], m["replayed_as"]) for m in rows]


def test_a_dead_letter_that_arrives_below_where_the_replay_is_fails_the_query_rather_than_being_skipped(tmp_path):
    table = str(tmp_path / "dlq")
    dead_letter(table, 3, "a", 17, "a-17")
    source = replay(table, tmp_path / "ck")
    source.available(0)
    assert read_all(source, "a", 0, 18) == [("a", 17, "a-17")]
    source.on_recorded(recorded(0, {"a": (0, 18)}))
    dead_letter(table, 1, "a", 5, "a-5", query_id="another")  # another query shares the table
    with pytest.raises(RegionalStoreError, match=r"1 record\(s\) reached the dead-letter table .* region 'a' at "
                                                 r"offset 5, below its committed offset 18"):
        source.available(1)


def test_a_table_that_is_not_a_dead_letter_table_or_none_at_all_is_refused(tmp_path):
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "t"), pa.table({"region": ["a"], "offset": [1], "value": ["x"]}))
    with pytest.raises(RegionalConfigError, match="not a regional dead-letter table"):
        load_input({"source": "deadletters", "path": str(tmp_path / "t")})
    with pytest.raises(RegionalConfigError, match="no Delta table"):
        load_input({"source": "deadLetters", "path": str(tmp_path / "none")})
    with pytest.raises(RegionalConfigError, match="needs the dead-letter table"):
        load_input({"source": "deadLetters"})
    with pytest.raises(RegionalConfigError, match="no Delta table"):
        summary(str(tmp_path / "none"))


def test_the_kafka_source_columns_replay_with_their_types(tmp_path):
    """A Kafka query's dead letters: binary key and value, a UTC timestamp, headers; read back as they were."""
    table = str(tmp_path / "dlq")
    when = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.timezone.utc)
    schema = KAFKA_SCHEMA  # the Kafka source's own columns, in Spark's order, region last
    record = {"region": ["t-0"], "offset": [7], "key": [b"k"], "value": [b"\x00\xff"], "topic": ["t"],
              "partition": [0], "timestamp": [when], "timestampType": [0], "headers": [[{"key": "h", "value": b"v"}]]}
    batch = pa.RecordBatch.from_pydict(record, schema)
    rows = dead_letter_rows(encode_records([batch], schema), "t-0", 7, 2, "ValueError: bad")
    sink = dead_letter_target(table, "original")
    sink.commit(2, {"t-0": sink.prepare(2, "t-0", iter(rows.to_batches()))})
    source = replay(table, tmp_path / "ck")
    # a dead-letter table (and its replay) has region and offset first, then the source's other columns
    assert source.schema == pa.schema([schema.field("region"), schema.field("offset"),
                                       *(f for f in schema if f.name not in ("region", "offset"))])
    assert source.schema_ddl == ("`region` STRING, `offset` BIGINT, `key` BINARY, `value` BINARY, `topic` STRING, "
                                 "`partition` INT, `timestamp` TIMESTAMP, `timestampType` INT, "
                                 "`headers` ARRAY<STRUCT<`key`: STRING, `value`: BINARY>>")
    source.before_splits(0)
    got = [r for b in source.read("t-0", 0, 8, source.split("t-0", 0, 8)) for r in b.to_pylist()]
    assert got == batch.to_pylist()


def test_spark_ddl_names_every_type_a_dead_letter_table_can_hold_and_refuses_others():
    schema = pa.schema([("a`b", pa.decimal128(10, 2)), ("m", pa.map_(pa.string(), pa.int64())),
                        ("n", pa.timestamp("us")), ("d", pa.date32()), ("f", pa.float64())])
    assert spark_ddl(schema) == ("`a``b` DECIMAL(10, 2), `m` MAP<STRING, BIGINT>, `n` TIMESTAMP_NTZ, `d` DATE, "
                                 "`f` DOUBLE")
    with pytest.raises(RegionalConfigError, match="column 'x' of the dead-letter table is"):
        spark_ddl(pa.schema([("x", pa.duration("s"))]))


def test_sql_text_and_error_class():
    assert sql_text("it's") == "'it''s'"
    assert error_class("ValueError: poison record x") == "ValueError"
    assert error_class("org.apache.spark.SparkException: Job aborted") == "org.apache.spark.SparkException"
    assert error_class("no class here") == "unknown" and error_class(None) == "unknown"
    assert set(REPLAY_COLUMNS) == {"replayed_by", "replayed_epoch", "replayed_as"}


def test_the_cli_prints_a_summary_and_json(tmp_path):
    table = str(tmp_path / "dlq")
    dead_letter(table, 3, ODD, 17, "x")
    text = subprocess.run([sys.executable, "-m", "regional", "dead-letters", table], capture_output=True,
                          text=True, check=True).stdout
    assert "1 record(s), 1 waiting for a replay, 0 replayed" in text and repr(ODD) in text and "ValueError" in text
    out = json.loads(subprocess.run([sys.executable, "-m", "regional", "dead-letters", table, "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    assert out["by_region"] == {ODD: {"records": 1, "waiting": 1, "oldest": {"epoch": 3, "offset": 17},
                                      "newest": {"epoch": 3, "offset": 17}}}
    failed = subprocess.run([sys.executable, "-m", "regional", "dead-letters", str(tmp_path / "none")],
                            capture_output=True, text=True)
    assert failed.returncode == 1 and "no Delta table" in failed.stderr


def test_a_dead_letter_that_arrives_between_the_plan_and_the_marks_is_not_marked_and_fails_the_next_plan(tmp_path):
    """The epoch's tasks read the table at the version kept for the epoch; the marks cover what they read, so a
    record that reaches the table inside the epoch's range meanwhile is not marked as replayed: it is late."""
    table = str(tmp_path / "dlq")
    dead_letter(table, 3, "a", 3, "a-3")
    dead_letter(table, 4, "a", 9, "a-9")
    source = replay(table, tmp_path / "ck")
    assert source.available(0) == {"a": 10}
    assert read_all(source, "a", 0, 10) == [("a", 3, "a-3"), ("a", 9, "a-9")]
    dead_letter(table, 5, "a", 5, "a-5", query_id="another")
    assert read_all(source, "a", 0, 10) == [("a", 3, "a-3"), ("a", 9, "a-9")]  # a re-run reads the same rows
    source.on_recorded(recorded(0, {"a": (0, 10)}))
    assert [(r, o, by is not None) for r, o, by, _e, _as in marks_of(table)] == [
        ("a", 3, True), ("a", 5, False), ("a", 9, True)]
    with pytest.raises(RegionalStoreError, match="region 'a' at offset 5, below its committed offset 10"):
        source.available(1)
    # A restarted replay (a new reader over the same store) reads the epoch's version again.
    restarted = replay(table, tmp_path / "ck")
    assert read_all(restarted, "a", 0, 10) == [("a", 3, "a-3"), ("a", 9, "a-9")]


def test_one_record_dead_lettered_twice_is_replayed_once_and_said_so_when_late(tmp_path):
    table = str(tmp_path / "dlq")
    dead_letter(table, 3, "a", 3, "a-3")
    dead_letter(table, 4, "a", 3, "a-3", query_id="another")  # two queries dead-lettered the same record
    source = replay(table, tmp_path / "ck")
    source.available(0)
    assert read_all(source, "a", 0, 4) == [("a", 3, "a-3")]
    source.on_recorded(recorded(0, {"a": (0, 4)}))
    assert summary(table).replayed == 2
    dead_letter(table, 9, "a", 3, "a-3", query_id="restarted")  # dead-lettered again after the replay
    with pytest.raises(RegionalStoreError, match=r"1 of them .* have the region and offset of a record already "
                                                 r"replayed.*delete those rows"):
        source.available(1)


def test_the_own_input_check_resolves_symbolic_links(tmp_path):
    from regional.location import same_location

    (tmp_path / "dlq").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "dlq")
    assert same_location(str(tmp_path / "alias"), f"file://{tmp_path / 'dlq'}/")
    assert not same_location(str(tmp_path / "dlq"), str(tmp_path / "other"))
    assert not same_location("s3a://bkt/dlq", "s3a://bkt/other") and same_location("s3://bkt/dlq", "s3a://bkt/dlq")


def test_a_sparse_input_probes_both_sides_of_its_suspect_and_a_dense_one_a_few_offsets():
    from regional.protocol.plan import PROBE_SPAN, probe_ranges

    assert probe_ranges(17, 42, 0, sparse=True) == [(0, 17), (18, 42)]
    assert probe_ranges(0, 42, 0, sparse=True) == [(1, 42)]  # a region's first record: the records after it
    assert probe_ranges(41, 42, 0, sparse=True) == [(0, 41)]
    assert probe_ranges(0, 1, 0, sparse=True) == []
    assert probe_ranges(17, 42, 0) == [(17 - PROBE_SPAN, 17)]
    assert probe_ranges(0, 42, 0) == [(1, 1 + PROBE_SPAN)]
