"""source=files: partition directories (key=value) as columns, named and typed as Spark's partition discovery does
(issue 59, item 7), without Spark. Spark's side of each type is measured in docs/sources/files.md and compared
record by record in integration/test_files_like_spark.py."""

from __future__ import annotations

import datetime
import math
import os
from decimal import Decimal

import pytest

from regional.errors import RegionalConfigError
from regional.inputs import files
from regional.inputs.files.manifest import SCHEMA
from regional.inputs.files.partitions import decide, infer_type, unescape
from regional.store import EpochKind, EpochRecord, RegionState, Store, source_log
from regional.store import files as store_files
from support import files_source as source
from support import write_file as write


def rows(s, region, start, end):
    return [r for b in s.read(region, start, end, s.split(region, start, end)) for r in b.to_pylist()]


def commit(ck, epoch, committed):
    Store(ck).write_record(EpochRecord(epoch, EpochKind.GLOBAL, {}, {},
                                       {r: RegionState(o, epoch) for r, o in committed.items()}))


# Spark 4.2's spark.read.text on n=<value> directories, measured (docs/sources/files.md): values -> the type
SPARK_TYPES = [
    (["1", "2"], "int"), (["01", "2"], "int"), (["-5", "+5"], "int"), (["1", "9999999999"], "bigint"),
    (["1", "99999999999999999999"], "decimal(20,0)"), (["1e3"], "decimal(4,0)"), (["1", "1.5"], "double"),
    (["NaN"], "double"), ([" 1"], "double"), (["1.5d", "0x1p3", "Infinity"], "double"), (["1", "x"], "string"),
    (["1", "2026-11-28"], "string"), (["true"], "string"), (["1", "__HIVE_DEFAULT_PARTITION__"], "int"),
    (["__HIVE_DEFAULT_PARTITION__", "2026-11-28"], "date"), (["2026-13-45"], "string"), (["2026-1-28"], "string"),
    (["2026-02-30"], "string"), (["%31"], "string"), (["9999999999", "1e3"], "decimal(20,0)"),
    (["1e3", "1.5"], "string"), (["1.5", "2026-11-28"], "string"),
    (["__HIVE_DEFAULT_PARTITION__"], "string"),  # Spark: void (no table holds it); regional: string
    # BigDecimal's precision minus its scale: 0e3 is DECIMAL(4,0); past 38 digits a DOUBLE (1e5000: Infinity, its
    # digits counted, never expanded: an INT of 5001 digits failed, and 1e9999999999 hung the driver)
    (["0e3"], "decimal(4,0)"), (["0e40"], "double"), (["1e5000"], "double"), (["\u0661\u0662\u0663"], "int"),
    # Spark types TIMESTAMP only yyyy-MM-dd HH:mm:ss[.S]: a "T", or no seconds, is a STRING (not refused)
    (["2026-11-28T00:00"], "string"), (["2026-11-28 10:00"], "string"), (["2026-11-28T10%3A00%3A00"], "string"),
]


@pytest.mark.parametrize(("values", "kind"), SPARK_TYPES, ids=[",".join(v) for v, _k in SPARK_TYPES])
def test_a_columns_type_is_what_spark_infers_from_its_values(values, kind):
    columns = decide([("r", f"n={v}/p.txt") for v in values], typed=True, where="in")
    assert columns.columns == (("n", kind),)
    assert decide([("r", f"n={v}/p.txt") for v in values], typed=False, where="in").columns == (("n", "string"),)


def test_values_are_spark_s_escaped_names_and_nulls():
    assert unescape("a%20b") == "a b" and unescape("c%3Dd") == "c=d" and unescape("%C3%A9") == "\u00c3\u00a9"
    assert unescape("100%") == "100%" and unescape("%zz") == "%zz"
    columns = decide([("r", "a%20b=x%2Fy/p.txt"), ("r", "a%20b=__HIVE_DEFAULT_PARTITION__/q.txt")], True, "in")
    assert columns.columns == (("a b", "string"),)
    assert columns.values("a%20b=x%2Fy/p.txt") == ["x/y"] and columns.values("a%20b=__HIVE_DEFAULT_PARTITION__/q") == [
        None]
    typed = decide([("r", "d=2026-11-28/x=1.5/m=1e3/p.txt"), ("r", "d=2026-11-29/x=NaN/m=7/p.txt")], True, "in")
    assert typed.values("d=2026-11-28/x=1.5/m=1e3/p.txt") == [datetime.date(2026, 11, 28), 1.5, Decimal(1000)]
    assert math.isnan(typed.values("d=2026-11-29/x=NaN/m=7/p.txt")[1])
    assert infer_type("2026-11-28 10%3A00%3A00", True) == "timestamp"
    with pytest.raises(RegionalConfigError, match="partitionColumnTypeInference"):
        decide([("r", "t=2026-11-28 10%3A00%3A00/p.txt")], True, "in")  # refused, not typed otherwise than Spark
    assert decide([("r", "t=2026-11-28 10%3A00%3A00/p.txt")], False, "in").values(
        "t=2026-11-28 10%3A00%3A00/p.txt") == ["2026-11-28 10:00:00"]


@pytest.mark.parametrize(("names", "says"), [
    (["n=/p.txt"], "empty value"), (["=1/p.txt"], "needs a column name"), (["a=1/a=2/p.txt"], "twice"),
    (["offset=1/p.txt"], "regional's own offset column"), (["Region=us/p.txt"], "regional's own region column"),
    (["a=1/p.txt", "b=1/p.txt"], "show different partition directories"),
    (["a=1/p.txt", "a=1/b=2/p.txt"], "show different partition directories"),  # mixed depth
    (["a=1/p.txt", "top.txt"], "show different partition directories"),  # a file beside them: Spark drops it
    (["a=1/p.txt", "plain/x.txt"], "show different partition directories"),
    (["a=1/b=1/p.txt", "b=1/a=1/p.txt"], "show different partition directories"),  # another order
    (["A=1/p.txt", "a=1/p.txt"], "one spelling"),
])
def test_layouts_spark_refuses_or_regional_cannot_hold_are_refused_naming_a_file(names, says):
    with pytest.raises(RegionalConfigError, match=says):
        decide([("r", n) for n in names], True, "in")


def test_no_partition_directories_leave_the_schema_and_the_batches_as_they_were(tmp_path):
    inp, ck = tmp_path / "in", tmp_path / "ck"
    write(inp / "r" / "a.txt", b"a\n")
    write(inp / "r" / "plain" / "deeper" / "b.txt", b"b\n")  # plain directories: read, no column
    s = source(inp, ck)
    assert s.schema is SCHEMA and s.schema_ddl == "region STRING, offset BIGINT, value STRING"
    assert s.available(0) == {"r": 2}
    assert [b.schema == SCHEMA for b in s.read("r", 0, 2, s.split("r", 0, 2))] == [True, True]


def test_partition_columns_from_the_start_and_what_a_later_directory_may_be(tmp_path):
    inp, ck = tmp_path / "in", tmp_path / "ck"
    write(inp / "us" / "date=2026-11-28" / "n=1" / "p.txt", b"a\nb\n")
    write(inp / "eu" / "date=2026-11-28" / "n=__HIVE_DEFAULT_PARTITION__" / "sub" / "q.txt", b"c\n")
    write(inp / "eu" / "_date=1" / "x.txt", b"not hidden: _key=value is a partition directory's name\n")
    with pytest.raises(RegionalConfigError, match="show different partition directories"):
        source(inp, ck)
    os.rename(inp / "eu" / "_date=1", inp / "eu" / ".date=1")  # a leading '.' hides it
    s = source(inp, ck)
    assert s.schema_ddl == "region STRING, offset BIGINT, value STRING, `date` DATE, `n` INT"
    assert s.available(0) == {"eu": 1, "us": 2}
    assert rows(s, "us", 0, 2) == [{"region": "us", "offset": 0, "value": "a", "date": datetime.date(2026, 11, 28),
                                    "n": 1}, {"region": "us", "offset": 1, "value": "b",
                                              "date": datetime.date(2026, 11, 28), "n": 1}]
    assert rows(s, "eu", 0, 1)[0]["n"] is None
    write(inp / "us" / "date=2026-11-29" / "n=2" / "p.txt", b"d\n")  # a new partition that fits: read
    assert s.available(1) == {"eu": 1, "us": 3} and rows(s, "us", 2, 3)[0]["date"] == datetime.date(2026, 11, 29)
    for bad, says in [("date=2026-11-30/n=x/p.txt", "its directory n='x' holds a value that the partition column n "
                                                    r"\(INT"),
                      ("date=2026-11-30/n=9999999999/p.txt", "partition column n"),  # wider: BIGINT
                      ("date=2026-11-30/p.txt", "shows the partition directories date"),  # a key missing
                      ("date=2026-11-30/n=1/h=1/p.txt", "shows the partition directories date, n, h"),  # a new key
                      ("top.txt", "shows no partition directory"),
                      ("date=/n=1/p.txt", "empty value")]:
        write(inp / "us" / bad, b"x\n")
        with pytest.raises(RegionalConfigError, match=says):
            s.available(2)
        (inp / "us" / bad).unlink()
    # A file moved to another partition before its records were read: read once, with its new directory's values.
    write(inp / "us" / "date=2026-11-29" / "n=3" / "m.txt", b"moved\n")
    assert s.available(3) == {"eu": 1, "us": 4}
    os.makedirs(inp / "us" / "date=2026-11-29" / "n=4")
    os.rename(inp / "us" / "date=2026-11-29" / "n=3" / "m.txt", inp / "us" / "date=2026-11-29" / "n=4" / "m.txt")
    assert s.available(4) == {"eu": 1, "us": 4}  # the same file: no new offsets
    assert [(r["value"], r["n"]) for r in rows(s, "us", 3, 4)] == [("moved", 4)]


def test_a_restart_keeps_the_checkpoint_s_columns_or_is_refused_naming_the_directory(tmp_path):
    inp, ck = tmp_path / "in", tmp_path / "ck"
    write(inp / "r" / "n=1" / "p.txt", b"a\n")
    s = source(inp, ck)
    assert s.available(0) == {"r": 1}
    commit(ck, 0, {"r": 1})
    write(inp / "r" / "n=x" / "p.txt", b"b\n")  # while stopped: the directories now infer n STRING
    with pytest.raises(RegionalConfigError, match=r"read its files with n INT, and the query now has n STRING "
                                                  r"\('n=x/p.txt' of region 'r'.*\.schema\('region STRING, offset "
                                                  r"BIGINT, value STRING, `n` INT'\)"):
        source(inp, ck).available(1)
    with pytest.raises(RegionalConfigError, match="read its files with n INT, and the query now has no partition"):
        source(inp, ck, recursiveFileLookup="true").available(1)
    given = files.create({"path": str(inp)})  # the advice: the old columns as the schema (Spark's .schema())
    given.use_schema([("region", "string"), ("offset", "bigint"), ("value", "string"), ("n", "int")])
    given.use_store(Store(ck))
    with pytest.raises(RegionalConfigError, match="its directory n='x'"):
        given.available(1)
    os.rename(inp / "r" / "n=x", inp / "r" / ".n=x")
    assert given.available(1) == {"r": 1}
    with pytest.raises(RegionalConfigError, match="regional types partition columns as INT"):
        given.use_schema([("region", "string"), ("offset", "bigint"), ("value", "string"), ("n", "boolean")])


def test_a_query_that_has_read_nothing_takes_the_columns_at_its_restart(tmp_path):
    inp, ck = tmp_path / "in", tmp_path / "ck"
    inp.mkdir()
    s = source(inp, ck)  # started on an empty path: no partition columns
    assert s.available(0) == {}
    write(inp / "r" / "date=2026-11-28" / "p.txt", b"a\n")
    with pytest.raises(RegionalConfigError, match="restart the query: it has read no file yet"):
        s.available(1)
    s = source(inp, ck)
    assert s.available(1) == {"r": 1} and rows(s, "r", 0, 1)[0]["date"] == datetime.date(2026, 11, 28)


def test_a_checkpoint_from_before_partition_columns_keeps_its_schema(tmp_path):
    """A query that ran with recursiveFileLookup=true before partition columns existed (its manifest names none):
    restarted with it, no column appears; restarted without it, the partition directories are refused."""
    inp, ck = tmp_path / "in", tmp_path / "ck"
    write(inp / "r" / "date=2026-11-28" / "p.txt", b"a\n")
    assert source(inp, ck, recursiveFileLookup="true").available(0) == {"r": 1}
    commit(ck, 0, {"r": 1})
    for path in (ck / "regional").rglob("*.json"):  # as a regional before issue 59 wrote it
        if "sources" in path.parts:
            record = store_files.decode(str(path), source_log.KIND, path.read_bytes())
            assert record.pop("partitions") == []
            path.write_bytes(store_files.encode(source_log.KIND, record))
    write(inp / "r" / "date=2026-11-29" / "p.txt", b"b\n")
    s = source(inp, ck, recursiveFileLookup="true")
    assert s.schema is SCHEMA and s.available(1) == {"r": 2} and rows(s, "r", 1, 2)[0] == {
        "region": "r", "offset": 1, "value": "b"}
    with pytest.raises(RegionalConfigError, match="read its files with no partition columns, and the query now "
                                                  "has date DATE"):
        source(inp, ck).available(2)


def test_type_inference_off_types_every_column_string_and_bad_values_are_refused(tmp_path):
    inp = tmp_path / "in"
    write(inp / "r" / "n=1" / "d=2026-11-28" / "p.txt", b"a\n")
    assert files.create({"path": str(inp), "partitionColumnTypeInference": "false"}).decide_schema().endswith(
        ", `n` STRING, `d` STRING")
    assert files.create({"path": str(inp)}).decide_schema().endswith(", `n` INT, `d` DATE")
    with pytest.raises(RegionalConfigError, match="must be true or false"):
        files.create({"path": str(inp), "partitionColumnTypeInference": "no"})
    with pytest.raises(RegionalConfigError, match="each region's directory is the base path"):
        from regional.spark.reader import check_read_options

        check_read_options(files.create({"path": str(inp)}), {"basePath": str(inp)})


def test_a_given_schema_types_the_values_whatever_the_inference_option(tmp_path):
    """.schema(...) with an INT column and partitionColumnTypeInference=false: Spark casts each value to the given
    type (SPARK-26188); regional read the option as typing every value STRING and refused n=1 for an INT."""
    inp = tmp_path / "in"
    write(inp / "r" / "n=1" / "p.txt", b"a\n")
    s = files.create({"path": str(inp), "partitionColumnTypeInference": "false"})
    s.use_schema([("region", "string"), ("offset", "bigint"), ("value", "string"), ("n", "int")])
    s.use_store(Store(tmp_path / "ck"))
    assert s.available(0) == {"r": 1} and rows(s, "r", 0, 1) == [{"region": "r", "offset": 0, "value": "a", "n": 1}]
    write(inp / "r" / "n=x" / "p.txt", b"b\n")
    with pytest.raises(RegionalConfigError, match="its directory n='x' holds a value"):
        s.available(1)


def test_a_file_moved_while_its_epoch_runs_keeps_the_values_it_was_planned_with(tmp_path):
    """Moved between planning and reading (docs/sources/files.md): every attempt of the epoch gives the planned
    directory's values, even into a directory that does not fit; the next listing then refuses that directory."""
    inp, ck = tmp_path / "in", tmp_path / "ck"
    write(inp / "us" / "n=1" / "p.txt", b"a\n")
    s = source(inp, ck)
    assert s.available(0) == {"us": 1}
    split = s.split("us", 0, 1)
    os.makedirs(inp / "us" / "n=x")
    os.rename(inp / "us" / "n=1" / "p.txt", inp / "us" / "n=x" / "p.txt")
    for _attempt in range(2):
        assert [r for b in s.read("us", 0, 1, split) for r in b.to_pylist()] == [
            {"region": "us", "offset": 0, "value": "a", "n": 1}]
    with pytest.raises(RegionalConfigError, match="its directory n='x'"):
        s.available(1)


def test_a_dead_letter_of_a_partitioned_file_carries_its_columns_and_replays_them(tmp_path):
    """A record of a file in partition directories, dead-lettered (the quarantined read's batches, as the task
    encodes them) into a real Delta dead-letter table, then read by the replay source: the same columns, types and
    values, nulls included."""
    from regional.dead_letters import dead_letter_rows, encode_records
    from regional.inputs import load_input
    from regional.targets import dead_letter_target

    inp, ck, table = tmp_path / "in", tmp_path / "ck", str(tmp_path / "dlq")
    write(inp / "us" / "d=2026-11-28" / "n=1" / "m=1e3" / "x=1.5" / "s=a%20b" / "p.txt", b"a\nb\n")
    null = "__HIVE_DEFAULT_PARTITION__"
    write(inp / "us" / f"d={null}" / f"n={null}" / "m=7" / "x=2" / "s=c" / "q.txt", b"c\n")
    s = source(inp, ck)
    assert s.available(0) == {"us": 3}
    for epoch, offset in ((1, 1), (2, 2)):
        batches = [b for b in s.read("us", offset, offset + 1, s.split("us", offset, offset + 1)) if b.num_rows]
        dead = dead_letter_rows(encode_records(batches, s.schema), "us", offset, epoch, "ValueError: bad")
        sink = dead_letter_target(table, "original")
        sink.commit(epoch, {"us": sink.prepare(epoch, "us", iter(dead.to_batches()))})
    replayed = load_input({"source": "deadLetters", "path": table})
    assert replayed.schema_ddl == ("`region` STRING, `offset` BIGINT, `value` STRING, `d` DATE, `n` INT, "
                                   "`m` DECIMAL(10, 0), `x` DOUBLE, `s` STRING")
    store = Store(str(tmp_path / "replay"))
    store.open_query()
    replayed.use_store(store)
    replayed.before_splits(0)
    assert replayed.available(0) == {"us": 3}
    assert [r for b in replayed.read("us", 0, 3, replayed.split("us", 0, 3)) for r in b.to_pylist()] == [
        {"region": "us", "offset": 1, "value": "b", "d": datetime.date(2026, 11, 28), "n": 1, "m": Decimal(1000),
         "x": 1.5, "s": "a b"},
        {"region": "us", "offset": 2, "value": "c", "d": None, "n": None, "m": Decimal(7), "x": 2.0, "s": "c"}]


@pytest.mark.parametrize("column", ["epoch", "Error", "replayed_as"])
def test_a_partition_column_named_like_a_dead_letter_column_is_refused_at_start(tmp_path, column):
    """Review of issue 59: a partition column named like the dead-letter table's own columns was accepted at .load(),
    and the query's first dead letter then failed it at every restart (renaming the directory changes the columns,
    which a restart refuses: only a new query got out). Now refused at start, naming the directory, dead letters on or
    not (a restart may add them)."""
    inp, ck = tmp_path / "in", tmp_path / "ck"
    write(inp / "us" / f"{column}=1700000000" / "p.txt", b"a\n")
    with pytest.raises(RegionalConfigError, match=f"'{column}=...'.*dead-letter table's own {column.lower()} column"):
        source(inp, ck)


@pytest.mark.parametrize("layout", ["missing", "bad region name"])
def test_load_before_the_input_exists_or_with_a_bad_region_defers_the_error_to_the_first_plan(tmp_path, layout):
    """`.load()` decides the partition columns from the files present. A path that does not exist yet (the demo
    creates it after `.load()`), or a region directory that cannot be a region, is reported by the first plan's
    listing with regional's own error, as before partition columns; `.load()` itself must not fail with Spark's
    wrapped traceback (the fresh clone's run at d0a1993 failed the demo and 3 tests so)."""
    inp, ck = tmp_path / "in", tmp_path / "ck"
    if layout == "bad region name":
        write(inp / "bad\nname" / "p.txt", b"a\n")
    s = source(inp, ck)
    assert s.schema.names == ["region", "offset", "value"]
    reported = "is not a directory" if layout == "missing" else "control characters"
    with pytest.raises(RegionalConfigError, match=reported):
        s.available(0)
