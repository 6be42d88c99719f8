"""Tables keep their schema (issue 26, item 4): the Delta target checks the query's columns against the table
before anything is staged, evolves it only with mergeSchema=true (in the epoch's own transaction), and writes a
partitioned table's partition values; on real Spark, read back with delta-spark and deltalake, row by row."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from integration.helpers import add_epoch_of_files, error_of, poison_udf, regional_stream

REGIONS = ["a", "b"]


def run(spark, inp, ck, out, columns, **write_options):
    """One run until no input is left, writing ``columns`` (name -> Column) besides region and offset."""
    df = regional_stream(spark, inp, ck)
    writer = (df.select("region", "offset", *[c.alias(n) for n, c in columns.items()]).writeStream
              .format("regional").option("target", "delta").option("path", str(out))
              .option("checkpointLocation", str(ck)))
    for key, value in {"keepRegionColumns": "true", **write_options}.items():
        writer = writer.option(key, value)
    query = writer.start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def rows(out, spark=None):
    """(region, offset, the other columns...) of every row, sorted; with delta-spark when given a session."""
    if spark is not None:
        df = spark.read.format("delta").load(str(out))
        return sorted(tuple(r) for r in df.select(*sorted(df.columns, key=_order)).collect())
    table = DeltaTable(str(out)).to_pyarrow_table()
    names = sorted(table.column_names, key=_order)
    return sorted(tuple(r[n] for n in names) for r in table.to_pylist())


def _order(name: str) -> tuple[int, str]:
    return ({"region": 0, "offset": 1}.get(name, 2), name)


def test_a_renamed_column_is_refused_naming_it_then_merge_schema_adds_it_and_nulls_nothing(spark, dirs):
    """value renamed to body, and a column added, across a restart: refused before anything is staged, naming
    the columns; with mergeSchema=true the table gains them in the epoch's transaction, old rows keep value."""
    inp, out, ck = dirs
    first = add_epoch_of_files(inp, REGIONS, "001", 3)
    run(spark, inp, ck, out, {"value": F.col("value")})
    second = add_epoch_of_files(inp, REGIONS, "002", 2)
    before = rows(out)
    renamed = {"body": F.col("value"), "size": F.length("value")}
    message = error_of(lambda: run(spark, inp, ck, out, renamed))
    assert "column 'body' (string) is not in the table" in message, message[-2000:]
    assert "column 'value' (string) of the table is not written" in message, message[-2000:]
    assert "mergeSchema" in message
    assert rows(out) == before  # nothing published, nothing nulled
    run(spark, inp, ck, out, renamed, mergeSchema="true")
    want = sorted([(r, o, v, len(v), None) for r, vs in second.items() for o, v in enumerate(vs, start=3)]
                  + [(r, o, None, None, v) for r, vs in first.items() for o, v in enumerate(vs)])
    assert rows(out, spark) == want  # columns: region, offset, then body, size, value
    assert rows(out) == want
    history = DeltaTable(str(out)).history()
    assert history[0]["operation"] == "WRITE" and "regional" in history[0]  # one commit: the schema and the rows


def test_an_int_into_a_string_column_and_keep_region_columns_toggled_are_refused(spark, dirs):
    inp, out, ck = dirs
    add_epoch_of_files(inp, REGIONS, "001", 2)
    run(spark, inp, ck, out, {"value": F.col("value")})
    add_epoch_of_files(inp, REGIONS, "002", 2)
    before = rows(out)
    message = error_of(lambda: run(spark, inp, ck, out, {"value": F.length("value")}))
    assert "column 'value' is string in the table, the query writes integer" in message, message[-2000:]
    message = error_of(lambda: run(spark, inp, ck, out, {"value": F.col("value")}, keepRegionColumns="false"))
    assert "column 'region' (string) of the table is not written" in message, message[-2000:]
    assert rows(out) == before


def test_an_existing_partitioned_table_gets_each_rows_partition_value(spark, dirs):
    """A table created partitioned by day (by another writer) gets day right for every row, read back by
    delta-spark and by deltalake; the files hold no day column, as Delta's layout has it."""
    inp, out, ck = dirs
    schema = pa.schema([("region", pa.string()), ("offset", pa.int64()), ("value", pa.string()),
                        ("day", pa.string())])
    write_deltalake(str(out), pa.table({"region": ["seed"], "offset": [0], "value": ["x"], "day": ["d0"]},
                                       schema=schema), partition_by=["day"])
    inputs = add_epoch_of_files(inp, REGIONS, "001", 7)
    day = F.concat(F.lit("d"), (F.col("offset") % 3).cast("string"))
    run(spark, inp, ck, out, {"value": F.col("value"), "day": day})
    want = sorted([(r, o, f"d{o % 3}", v) for r, vs in inputs.items() for o, v in enumerate(vs)]
                  + [("seed", 0, "d0", "x")])
    assert rows(out, spark) == want
    assert rows(out) == want
    table = DeltaTable(str(out))
    assert table.metadata().partition_columns == ["day"]
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert len(adds) >= 4 and all(a["partition.day"] in ("d0", "d1", "d2") for a in adds)


def test_a_dead_letter_table_with_another_column_type_is_refused(spark, dirs, tmp_path):
    """Same column names, another type (offset as text): the first dead letter is refused before the epoch's
    intent, naming both shapes; nothing lands in either table for that epoch."""
    inp, out, ck = dirs
    dlq = tmp_path / "dead-letters"
    write_deltalake(str(dlq), pa.table({"region": ["r"], "offset": ["not a number"], "value": ["v"], "epoch": [0],
                                        "error": ["e"]}))
    inputs = add_epoch_of_files(inp, REGIONS, "001", 4)
    udf = poison_udf({inputs["a"][2]})
    message = error_of(lambda: run(spark, inp, ck, out, {"value": udf("value")}, deadLetterPath=str(dlq)))
    assert f"deadLetterPath={dlq} is a Delta table with columns" in message, message[-2000:]
    assert "offset string" in message and "offset int64" in message, message[-2000:]
    assert len(DeltaTable(str(dlq)).to_pyarrow_table()) == 1
