"""regional and delta-spark on one table (issue 59, third pass): what delta-spark does to a table regional writes,
and the other way round, never loses or doubles a row. Checkpoints delta-rs writes for regional's commits, read by
delta-spark; OPTIMIZE and VACUUM between regional's epochs; a delta-spark streaming read of a regional table;
delta-spark appends (and a schema-merging one) into a table regional created; both writers at once; TIMESTAMP_NTZ
columns; statistics at the edges of each type; and each refusal's advice, followed. Rows are compared record by
record, as delta-spark's stock reader reads them."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from integration.helpers import error_of
from integration.test_delta_protocol import REGIONS, create, regional_run, spark_rows, stock_write
from integration.test_delta_stats_like_spark import check_reads, compare_stats, file_stats, stock_files
from regional.inputs.generator import generated_value
from regional.spark.session import delta_fits_spark

pytestmark = pytest.mark.skipif(not delta_fits_spark(), reason="delta-spark is the reference: it needs its jar")

EPOCH = dt.datetime(1970, 1, 1)


def ntz(offset: int) -> dt.datetime:
    """The TIMESTAMP_NTZ the queries below write for an offset (microseconds, before and after 1970)."""
    return EPOCH + dt.timedelta(microseconds=(offset - 2) * 86_400_000_123)


def ntz_column() -> Any:
    return F.timestamp_micros((F.col("offset") - 2) * 86_400_000_123).cast("timestamp_ntz")


def want_rows(start: int, end: int, regions: list[str] = REGIONS) -> list[tuple]:
    """(offset, region, tn, value): the columns sorted by name, as spark_rows reads them."""
    return [(o, r, ntz(o), generated_value(r, o)) for r in regions for o in range(start, end)]


def run(spark: SparkSession, ck: Path, out: Path, columns: dict[str, Column], total: int, per_epoch: int,
        **options: str) -> None:
    """regional_run in epochs of ``per_epoch`` records per region (restarting ``ck`` goes on from its offsets)."""
    regional_run(spark, ck, out, columns, total, per_epoch=per_epoch, available_now=False, **options)


def logged_versions(table: Path, suffix: str) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (table / "_delta_log").glob(f"*{suffix}"))


def engine_of(table: Path, version: int) -> str:
    for line in (table / "_delta_log" / f"{version:020d}.json").read_text().splitlines():
        info = json.loads(line).get("commitInfo")
        if info is not None:
            return str(info.get("engineInfo") or "")
    return ""


@pytest.mark.campaign  # 249 s at a load of 18 on 2 cores (VACUUM the most of it), keeping CI within its time
def test_timestamp_ntz_checkpoints_optimize_vacuum_and_a_delta_spark_stream_of_a_regional_table(spark, tmp_path):
    """Items 2, 3, 4 and 7. regional creates the table (a TIMESTAMP_NTZ column: the timestampNtz feature) and
    writes it in epochs; delta.checkpointInterval = 2 makes delta-rs checkpoint regional's commits, and delta-spark
    reads the table from such a checkpoint alone (the JSON commits before it removed, as log cleanup does) the same
    rows, and regional's idempotency mark with it. delta-spark OPTIMIZEs and VACUUMs (RETAIN 0 HOURS) between
    regional's runs; a delta-spark streaming read of the table, run after each step, sees every row exactly once."""
    import shutil

    out, ck, stream_ck = tmp_path / "out", tmp_path / "ck", tmp_path / "stream-ck"
    columns = {"value": F.col("value"), "tn": ntz_column()}
    seen: list[tuple] = []

    def stream() -> None:
        query = (spark.readStream.format("delta").load(str(out)).writeStream
                 .foreachBatch(lambda df, _: seen.extend(tuple(r) for r in df.select(*sorted(df.columns)).collect()))
                 .option("checkpointLocation", str(stream_ck)).trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None, str(query.exception())[-3000:]

    run(spark, ck, out, columns, 2, 2)
    protocol = DeltaTable(str(out)).protocol()
    assert "timestampNtz" in (protocol.reader_features or []) and "timestampNtz" in (protocol.writer_features or [])
    assert spark.read.format("delta").load(str(out)).schema["tn"].dataType.typeName() == "timestamp_ntz"
    assert spark_rows(spark, out) == sorted(want_rows(0, 2), key=repr)
    stream()
    spark.sql(f"ALTER TABLE delta.`{out}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    run(spark, ck, out, columns, 6, 2)  # the same query: 2 more epochs
    stream()
    regional_checkpoints = [v for v in logged_versions(out, ".checkpoint.parquet") if "delta-rs" in engine_of(out, v)]
    assert regional_checkpoints, sorted(p.name for p in (out / "_delta_log").iterdir())
    assert spark_rows(spark, out) == sorted(want_rows(0, 6), key=repr)
    # The checkpoint alone: a copy of the table without the commits it replaces.
    last = regional_checkpoints[-1]
    alone = tmp_path / "alone"
    shutil.copytree(out, alone)
    for version in logged_versions(alone, ".json"):
        if version <= last:
            (alone / "_delta_log" / f"{version:020d}.json").unlink()
    for crc in (alone / "_delta_log").glob("*.crc"):
        crc.unlink()
    assert spark_rows(spark, alone) == sorted(want_rows(0, 6), key=repr)
    app = next(json.loads(line)["txn"]["appId"] for line in (out / "_delta_log" / f"{last:020d}.json").read_text()
               .splitlines() if "txn" in json.loads(line))
    assert DeltaTable(str(alone)).transaction_version(app) == DeltaTable(str(out)).transaction_version(app)
    # OPTIMIZE and VACUUM by delta-spark, then regional writes on.
    spark.sql(f"OPTIMIZE delta.`{out}`")
    # VACUUM lists the table in spark.sql.sources.parallelPartitionDiscovery.parallelism tasks (10,000: minutes on
    # two cores) unless told.
    vacuum_conf = {"spark.databricks.delta.retentionDurationCheck.enabled": "false",
                   "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2"}
    for key, value in vacuum_conf.items():
        spark.conf.set(key, value)
    try:
        spark.sql(f"VACUUM delta.`{out}` RETAIN 0 HOURS")
    finally:
        for key in vacuum_conf:
            spark.conf.unset(key)
    assert spark_rows(spark, out) == sorted(want_rows(0, 6), key=repr)
    run(spark, ck, out, columns, 8, 2)
    stream()
    assert spark_rows(spark, out) == sorted(want_rows(0, 8), key=repr)
    assert sorted(seen, key=repr) == sorted(want_rows(0, 8), key=repr)  # each row once: OPTIMIZE adds no data


def test_delta_spark_appends_into_a_table_regional_created_and_regional_writes_on(spark, tmp_path):
    """Item 5. delta-spark appends to a table regional created, then appends with a new column (mergeSchema);
    regional's next epoch without mergeSchema is refused before anything is published (naming the column and the
    option), and with it writes on: every row of both writers once, the new column null in regional's rows."""
    out, ck = tmp_path / "out", tmp_path / "ck"
    columns = {"value": F.col("value"), "tn": ntz_column()}
    regional_run(spark, ck, out, columns, 2)
    stock_write(spark, out, columns, 0, 2, regions=["spark"])
    stock_write(spark, out, {**columns, "extra": F.col("offset") * 10}, 2, 4, regions=["spark"], mergeSchema="true")
    version = DeltaTable(str(out)).version()
    message = error_of(lambda: regional_run(spark, ck, out, columns, 4))
    assert "column 'extra' (long) of the table is not written" in message and "mergeSchema" in message, \
        message[-3000:]
    assert DeltaTable(str(out)).version() == version
    regional_run(spark, ck, out, columns, 4, mergeSchema="true")
    want = [(None, *row) for row in want_rows(0, 4)] + [(None, *row) for row in want_rows(0, 2, ["spark"])] + \
        [(o * 10, *row) for o, row in zip(range(2, 4), want_rows(2, 4, ["spark"]), strict=True)]
    assert spark_rows(spark, out) == sorted(want, key=repr)


def test_delta_spark_and_regional_write_one_table_at_once(spark, tmp_path):
    """Item 6. A delta-spark batch append loop in a thread while a regional streaming query publishes epoch after
    epoch into the same table: Delta's conflict detection on both sides; at the end every row of both writers is
    in the table exactly once."""
    out, ck = tmp_path / "out", tmp_path / "ck"
    create(spark, out, "region STRING, offset BIGINT, value STRING, tn TIMESTAMP_NTZ")
    columns = {"value": F.col("value"), "tn": ntz_column()}
    done, written, errors = threading.Event(), [], []

    def appends() -> None:
        offset = 0
        try:
            while not done.is_set() or offset < 3:
                stock_write(spark, out, columns, offset, offset + 1, regions=["spark"])
                written.append(offset)
                offset += 1
        except Exception as exc:  # reported by the test, below
            errors.append(exc)

    thread = threading.Thread(target=appends)
    thread.start()
    try:
        run(spark, ck, out, columns, 10, 2)
    finally:
        done.set()
        thread.join(300)
    assert not errors, str(errors[0])[-3000:]
    want = want_rows(0, 10) + want_rows(0, len(written), ["spark"])
    assert spark_rows(spark, out) == sorted(want, key=repr)
    # The two writers' commits interleave (else this proves nothing about conflicts).
    engines = [engine_of(out, v) for v in logged_versions(out, ".json")]
    switches = sum(1 for a, b in itertools.pairwise(engines) if ("delta-rs" in a) != ("delta-rs" in b))
    assert switches >= 2, engines


LONGS = [-(2**63), 2**63 - 1, 0, -1, None]
TIMES = ["0001-01-01 00:00:00", "9999-12-31 23:59:59.999999", "1969-12-31 23:59:59.999999", "1970-01-01 00:00:00",
         None]


@pytest.mark.campaign  # within CI's 30 minutes: test_delta_stats_like_spark covers NaN, +-inf, -0.0, long strings
def test_statistics_at_the_types_edges_and_the_indexed_columns_properties_equal_delta_sparks(spark, tmp_path):
    """Item 1, what test_delta_stats_like_spark's CI test leaves out (its NaN, infinities, -0.0, empty, long and
    non-ASCII strings and NULLs stay there): the greatest and least longs, timestamps at year 1 and 9999 (with and
    without time zone), and the two properties that choose the indexed columns (its test of them is a campaign
    test). regional's stats equal delta-spark's for the same rows, and filtered reads return the same rows."""
    o, region = F.col("offset"), F.col("region")
    n = F.when(region == "g001", 1).otherwise(0)

    def pick(values: list[Any], kind: str) -> Any:
        array = F.array(*[F.lit(v).cast(kind) for v in values])
        return F.element_at(array, ((o + n * 2) % len(values) + 1).cast("int"))

    columns = {"value": F.col("value"), "k": pick(LONGS, "bigint"), "ts": pick(TIMES, "timestamp"),
               "tn": pick(TIMES, "timestamp_ntz"), "s": F.repeat(F.lit("z"), (o * 20).cast("int"))}
    schema = "region STRING, offset BIGINT, value STRING, k BIGINT, ts TIMESTAMP, tn TIMESTAMP_NTZ, s STRING"
    for name, properties in (("cols", "'delta.dataSkippingStatsColumns' = 'k, tn, s'"),
                             ("num", "'delta.dataSkippingNumIndexedCols' = '5'")):
        ours, theirs, ck = tmp_path / f"ours-{name}", tmp_path / f"theirs-{name}", tmp_path / f"ck-{name}"
        for table in (ours, theirs):
            create(spark, table, schema, f"TBLPROPERTIES ({properties})")
        regional_run(spark, ck, ours, columns, 5)
        stock_files(spark, theirs, columns, 0, 5)
        compare_stats(ours, theirs)
        indexed = set(file_stats(ours)[0]["minValues"])
        assert indexed == ({"k", "tn", "s"} if name == "cols" else {"region", "offset", "value", "k", "ts"}), indexed
        check_reads(spark, ours, theirs, [
            f"k = {2**63 - 1}", f"k = {-(2**63)}", "k IS NULL", "ts < TIMESTAMP '0002-01-01'",
            "ts >= TIMESTAMP '9999-12-31 23:59:59.999'", "tn > TIMESTAMP_NTZ '9999-12-31 23:59:59'",
            "tn <= TIMESTAMP_NTZ '0001-01-01 00:00:00'", "s > '" + "z" * 40 + "'", "s = ''"])


def test_following_the_advice_of_a_refused_feature_leads_to_a_table_regional_writes(spark, tmp_path):
    """Item 8. DROP FEATURE rowTracking leaves domainMetadata in the protocol, and inCommitTimestamp stays after
    'delta.enableInCommitTimestamps' = 'false': regional refuses each step until the advice it prints is followed,
    and then writes the table (rows as delta-spark reads them)."""
    columns = {"value": F.col("value"), "tn": ntz_column()}
    for name, tail, steps in (
            ("rows", "'delta.enableRowTracking' = 'true'",
             [("rowTracking", "ALTER TABLE {t} DROP FEATURE rowTracking"),
              ("domainMetadata", "ALTER TABLE {t} DROP FEATURE domainMetadata")]),
            ("ict", "'delta.enableInCommitTimestamps' = 'true'",
             [("inCommitTimestamp", "ALTER TABLE {t} DROP FEATURE inCommitTimestamp")])):
        out, ck = tmp_path / name, tmp_path / f"ck-{name}"
        create(spark, out, "region STRING, offset BIGINT, value STRING, tn TIMESTAMP_NTZ", f"TBLPROPERTIES ({tail})")
        for feature, advice in steps:
            message = error_of(lambda: regional_run(spark, ck, out, columns, 2))  # noqa: B023 - called here
            assert f"table feature '{feature}'" in message, message[-3000:]
            assert advice.format(t="...") in message, (advice, message[-3000:])
            spark.sql(advice.format(t=f"delta.`{out}`"))
        regional_run(spark, ck, out, columns, 2)
        assert spark_rows(spark, out) == sorted(want_rows(0, 2), key=repr)
