"""Restarts that change the query (README's table "Changes between restarts"): what is allowed lands every
record exactly once; what is not is refused at start, naming the change."""

from __future__ import annotations

from deltalake import DeltaTable

from integration.helpers import (
    add_epoch_of_files,
    assert_exactly_once,
    merge,
    poison_udf,
    regional_stream,
    run_epochs,
)

REGIONS = ["a", "b", "c"]


def start(spark, inp, ck, out, udf, read_options=None, **write_options):
    df = regional_stream(spark, inp, ck, **(read_options or {}))
    writer = (df.select("region", "offset", udf("value").alias("value")).writeStream.format("regional")
              .option("target", "delta").option("path", str(out)).option("checkpointLocation", str(ck))
              .option("keepRegionColumns", "true"))
    for key, value in write_options.items():
        writer = writer.option(key, value)
    return writer.start()


def test_settings_changed_between_restarts_lose_and_double_nothing(spark, dirs, tmp_path):
    """maxRecordsPerRegion, regionAttempts, deadLetterPath and deadLetterOn changed at each restart, with a poison
    record in the second run's input: every other record lands once, the poison record in the dead letters once
    (on its first failure alone: deadLetterOn names its ValueError; the evidence rule is test_dead_letters')."""
    inp, out, ck = dirs
    dlq = tmp_path / "dead-letters"
    first = add_epoch_of_files(inp, REGIONS, "001", 30)
    poison = {first["b"][25]}
    udf = poison_udf(poison)
    query = start(spark, inp, ck, out, udf, {"maxRecordsPerRegion": "10"})
    run_epochs(query, ck, 2)  # stops part-way: 20 of each region's 30 records
    second = add_epoch_of_files(inp, REGIONS, "002", 10)
    query = start(spark, inp, ck, out, udf, {"maxRecordsPerRegion": "25"}, regionAttempts="3",
                  deadLetterPath=str(dlq), deadLetterOn="ValueError")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    third = add_epoch_of_files(inp, REGIONS, "003", 5)
    query = start(spark, inp, ck, out, udf)  # no limit, default attempts, no dead letters any more
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    inputs = merge(first, second, third)
    expected = {r: [(o, v.upper()) for o, v in enumerate(values) if v not in poison] for r, values in inputs.items()}
    assert_exactly_once(out, expected, spark)
    letters = DeltaTable(str(dlq)).to_pyarrow_table().to_pylist()
    assert [(r["region"], r["offset"], r["error"]) for r in letters] == [
        ("b", 25, "ValueError: poison record b-001-25")]


def test_target_path_changed_between_restarts_continues_into_the_new_table(spark, dirs, tmp_path):
    """Allowed, as Spark allows changing a file sink's path: the new table receives what was not published yet,
    the old one keeps what it had; together, every record once."""
    inp, out, ck = dirs
    other = tmp_path / "other-table"
    first = add_epoch_of_files(inp, REGIONS, "001", 10)
    upper = poison_udf(set())
    query = start(spark, inp, ck, out, upper)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    second = add_epoch_of_files(inp, REGIONS, "002", 10)
    query = start(spark, inp, ck, other, upper)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly_once(out, {r: [(o, v.upper()) for o, v in enumerate(values)] for r, values in first.items()})
    assert_exactly_once(other, {r: [(o + 10, v.upper()) for o, v in enumerate(values)]
                                for r, values in second.items()})
