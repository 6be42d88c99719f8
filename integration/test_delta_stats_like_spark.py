"""The statistics of regional's add actions against delta-spark's own (issue 46): the same rows written by a real
regional query and by delta-spark's writer (one file per region each), into tables of the same properties; the
parsed ``stats`` of each file compared field by field (physical names mapped back to the logical ones), and
filtered reads by delta-spark: the same rows from both tables (a wrong bound would make delta-spark skip a file
holding matching rows: rows lost), and regional's files pruned as delta-spark's are.

Adversarial values: strings at and past the 32-character prefix (non-ASCII, surrogate pairs at the cut, U+007F,
U+10FFFF), NULL-heavy and all-NULL columns, NaN, -0.0 and infinities, timestamps with microseconds before and
after 1970, decimals, dates, structs with NULL parents. Then column mapping with a rename, a partition column,
``delta.dataSkippingNumIndexedCols`` and ``delta.dataSkippingStatsColumns`` changed between runs.
"""

from __future__ import annotations

import decimal
import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from integration.test_delta_protocol import REGIONS, create, regional_run, source_rows
from regional.spark.session import delta_fits_spark

pytestmark = pytest.mark.skipif(not delta_fits_spark(), reason="delta-spark is the reference: it needs its jar")

STRINGS = ["", "a", "a" * 32, "a" * 33, "b" * 31 + "😀" + "z", "😀" * 20, "a" * 32 + "\x7f" * 3 + "b",
           "a" * 32 + "\U0010ffff" * 2 + "c", "a" * 32 + "\U0010ffff" * 40, "é" * 40, "\x00", "zz" * 30 + "\u00ff",
           "\U0010ffff" * 3, "a" * 31 + "é" + "é"]
FLOATS = [float("nan"), -0.0, 0.0, 1.5, float("inf"), float("-inf"), -2.25, 1e300, None]


def pick(values: list[Any], index: Column, kind: str) -> Column:
    """values[index % len(values)] as a Spark column of ``kind``."""
    array = F.array(*[F.lit(v).cast(kind) for v in values])
    return F.element_at(array, (index % len(values) + 1).cast("int"))


def region_number(region: Column) -> Column:
    return F.when(region == "g001", 1).otherwise(0)


def stock_files(spark: SparkSession, out: Path, columns: dict[str, Column], start: int, end: int) -> None:
    """delta-spark's append of the same rows, one file per region (as regional writes them in one epoch), in one
    write: a range partitioning by region puts each region in a partition of its own."""
    df = source_rows(spark, start, end).repartitionByRange(len(REGIONS), "region")
    df.select("region", "offset", *[c.alias(n) for n, c in columns.items()]) \
        .write.format("delta").mode("append").save(str(out))


def logical_names(schema: dict[str, Any]) -> dict[str, Any]:
    """physical name -> (logical name, the same for a struct's fields)."""
    out = {}
    for f in schema["fields"]:
        physical = (f.get("metadata") or {}).get("delta.columnMapping.physicalName", f["name"])
        kind = f["type"]
        out[physical] = (f["name"], logical_names(kind) if isinstance(kind, dict) and kind["type"] == "struct" else {})
    return out


def relabel(value: Any, names: dict[str, Any]) -> Any:
    if not isinstance(value, dict):
        return value
    return {names[k][0]: relabel(v, names[k][1]) if k in names else v for k, v in value.items()} \
        if names else value


def file_stats(table: Path) -> list[dict[str, Any]]:
    """Each file's parsed stats (logical names; decimals exact), in a stable order."""
    names: dict[str, Any] = {}
    out: list[dict[str, Any]] = []
    for log in sorted((table / "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "metaData" in action:
                names = logical_names(json.loads(action["metaData"]["schemaString"]))
            if "add" in action:
                stats = json.loads(action["add"]["stats"], parse_float=decimal.Decimal)
                for key in ("minValues", "maxValues", "nullCount"):
                    if key in stats:
                        stats[key] = relabel(stats[key], names)
                out.append(stats)
    return sorted(out, key=lambda s: json.dumps(s, default=str, sort_keys=True))


def compare_stats(ours: Path, theirs: Path) -> None:
    mine, stock = file_stats(ours), file_stats(theirs)
    assert len(mine) == len(stock)
    for got, want in zip(mine, stock, strict=True):
        assert got == want, f"\nregional    {got}\ndelta-spark {want}"


def filtered(spark: SparkSession, table: Path, predicate: str) -> tuple[list[tuple], int]:
    df = spark.read.format("delta").load(str(table)).where(predicate)
    return sorted(tuple(map(repr, r)) for r in df.select("region", "offset").collect()), len(df.inputFiles())


def check_reads(spark: SparkSession, ours: Path, theirs: Path, predicates: list[str]) -> None:
    """Every predicate reads the same rows from both tables, scanning as many files (pruned as delta-spark's)."""
    for predicate in predicates:
        got, want = filtered(spark, ours, predicate), filtered(spark, theirs, predicate)
        assert got == want, f"{predicate}: regional {got}, delta-spark {want}"


def test_stats_equal_delta_sparks_for_every_type_and_prune_its_reads(spark, tmp_path):
    ours, theirs, ck = tmp_path / "ours", tmp_path / "theirs", tmp_path / "ck"
    for table in (ours, theirs):
        create(spark, table, "region STRING, offset BIGINT, value STRING, k BIGINT, i INT, s STRING, ts TIMESTAMP, "
               "tn TIMESTAMP_NTZ, f DOUBLE, fl FLOAT, d DECIMAL(12,3), dt DATE, b BOOLEAN, "
               "st STRUCT<x: INT, y: STRING>, arr ARRAY<INT>, allnull STRING",
               "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    o, r = F.col("offset"), F.col("region")
    n = region_number(r)
    micros = (o - 7) * 86_400_000_123 + F.when(o % 3 == 0, 999).otherwise(F.when(o % 3 == 1, -1).otherwise(999_999))
    columns = {
        "value": F.col("value"),
        "k": o + n * 1000,
        "i": F.when(o % 9 == 4, o.cast("int") - n * 50).otherwise(F.lit(None).cast("int")),  # NULL-heavy
        "s": pick(STRINGS, o + n * 5, "string"),
        "ts": F.timestamp_micros(micros + n * 10**13),
        "tn": F.timestamp_micros(micros - n * 10**12).cast("timestamp_ntz"),
        "f": pick(FLOATS, o + n * 2, "double"),
        "fl": pick([0.1, -0.0, 3.4e38, None, 1.17549435e-38, 2.5], o + n, "float"),
        "d": (o * 1234 - 20_000 + n).cast("decimal(12,3)") / 7,
        "dt": F.date_add(F.lit("1969-12-25").cast("date"), (o * 3 + n * 400).cast("int")),
        "b": F.when(o % 4 == 0, F.lit(None)).otherwise(o % 2 == 0),
        "st": F.when(o % 5 == 1, F.lit(None)).otherwise(
            F.struct((o * n).cast("int").alias("x"), F.when(o % 3 == 0, F.lit(None)).otherwise(
                pick(STRINGS, o, "string")).alias("y"))),
        "arr": F.when(o % 2 == 0, F.array(o.cast("int"))).otherwise(F.lit(None)),
        "allnull": F.lit(None).cast("string"),
    }
    columns["d"] = columns["d"].cast("decimal(12,3)")
    regional_run(spark, ck, ours, columns, 30)
    stock_files(spark, theirs, columns, 0, 30)
    compare_stats(ours, theirs)
    stats = file_stats(ours)[0]
    assert stats["tightBounds"] is True and stats["nullCount"]["allnull"] == 30
    # A selective filter prunes regional's files as delta-spark's: one file of two is read.
    assert filtered(spark, ours, "k >= 1000")[1] == 1
    check_reads(spark, ours, theirs, [
        "value = 'g001:3'", "i < -40 OR i IS NULL", f"s = '{'a' * 32}\x7f\x7f\x7fb' OR s >= '{'a' * 32}\U0010ffff'",
        "s = '" + "😀" * 20 + "' OR s = ''", "ts > TIMESTAMP '2000-01-01 00:00:00'", "tn < TIMESTAMP_NTZ '1969-12-01'",
        "isnan(f) OR f = 0.0", "fl > 3e38 OR d < -2000", "dt > DATE '1971-01-01'", "st.x > 10",
    ])


@pytest.mark.campaign  # 149 s loaded, keeping CI within its time
def test_column_mapping_rename_partitions_and_indexed_columns_changed_between_runs(spark, tmp_path):
    ours, theirs, ck = tmp_path / "ours", tmp_path / "theirs", tmp_path / "ck"
    for table in (ours, theirs):
        create(spark, table, "region STRING, offset BIGINT, p STRING, value STRING, a BIGINT, b STRING",
               "PARTITIONED BY (p) TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
               "'delta.dataSkippingNumIndexedCols' = '3')")
    o = F.col("offset")
    a = o * 10 + region_number(F.col("region")) * 1000
    first = {"p": F.lit("x"), "value": F.col("value"), "a": a, "b": F.concat(F.lit("b"), o.cast("string"))}
    regional_run(spark, ck, ours, first, 4)
    stock_files(spark, theirs, first, 0, 4)
    for table in (ours, theirs):
        spark.sql(f"ALTER TABLE delta.`{table}` RENAME COLUMN b TO c")
        spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.dataSkippingNumIndexedCols' = '-1')")
    second = {"p": F.lit("x"), "value": F.col("value"), "a": a,
              "c": F.when(o % 2 == 0, F.lit(None)).otherwise(F.concat(F.lit("c"), o.cast("string")))}
    regional_run(spark, ck, ours, second, 8)  # the same query, restarted: offsets 4..7
    stock_files(spark, theirs, second, 4, 8)
    for table in (ours, theirs):
        spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.dataSkippingStatsColumns' = 'C, `offset`')")
    regional_run(spark, ck, ours, second, 12)
    stock_files(spark, theirs, second, 8, 12)
    compare_stats(ours, theirs)
    # 6 files: run 1 has no stats for c (not among the first 3), runs 2 and 3 do (all; statsColumns through the
    # physical name of the renamed column); offset is indexed in all three runs.
    assert filtered(spark, ours, "c = 'c1'")[1] == filtered(spark, ours, "offset < 4")[1] == 2
    check_reads(spark, ours, theirs, ["a >= 1000", "c = 'c1'", "c IS NULL", "offset < 4", "value = 'g000:2'"])
