"""Bad input: each a clear error naming the problem, and nothing published."""

from __future__ import annotations

import re

import pytest
from pyspark.sql import functions as F

import regional
from integration.helpers import (
    add_epoch_of_files,
    add_file,
    assert_exactly_once_in_order,
    error_of,
    expected_rows,
    merge,
    regional_stream,
    run_until_error,
    start_to_delta,
    table_rows,
)
from regional.errors import RegionalConfigError


def test_sink_without_region_and_offset_columns_fails_at_start(spark, dirs):
    inp, out, ck = dirs
    add_epoch_of_files(inp, ["a"], "001", 3)
    df = regional_stream(spark, inp, ck).select(F.upper("value").alias("value"))
    message = error_of(lambda: df.writeStream.format("regional").option("target", "delta")
                       .option("path", str(out)).option("checkpointLocation", str(ck)).start())
    assert re.search(r"needs the columns 'region' and 'offset'.*keep them in your select", message, re.S)
    assert not out.exists()


def test_unknown_source(spark, dirs):
    inp, out, ck = dirs
    message = error_of(lambda: start_to_delta(regional_stream(spark, inp, ck, source="kafak"), out, ck))
    assert re.search(r"unknown source 'kafak'.*'files'", message, re.S)
    assert not out.exists()


def test_unknown_target(spark, dirs):
    inp, out, ck = dirs
    add_epoch_of_files(inp, ["a"], "001", 3)
    for target, message in [("parquet", r"unknown target 'parquet'"),
                            ("python:no_such_module:X", r"cannot import module 'no_such_module'"),
                            ("python:integration.faults:Nope", r"has no class 'Nope'")]:
        got = error_of(lambda t=target: start_to_delta(regional_stream(spark, inp, ck), out, ck, target=t))
        assert re.search(message, got), got[-2000:]
    assert not out.exists()


def test_a_misspelt_option_on_either_side_is_refused_by_name_before_anything_runs(spark, dirs):
    inp, out, ck = dirs
    add_epoch_of_files(inp, ["a"], "001", 3)
    # readStream: refused at .load(), naming the option and the one meant
    message = error_of(lambda: start_to_delta(regional_stream(spark, inp, ck, maxRecordsPerRegoin="5"), out, ck))
    assert re.search(r"'maxrecordsperregoin' is not an option.*Did you mean 'maxRecordsPerRegion'", message, re.S), \
        message[-2000:]
    # writeStream: refused by start() itself (the target declares its options), naming it, before the query
    # plans anything: the checkpoint holds no offset and no regional store
    with pytest.raises(RegionalConfigError, match=r"(?si)'mergeSchemaa' is not an option.*Did you mean 'mergeSchema'"):
        start_to_delta(regional_stream(spark, inp, ck), out, ck, mergeSchemaa="true")
    assert not (ck / "offsets").exists() and not (ck / "regional").exists(), sorted(p.name for p in ck.rglob("*"))
    assert not out.exists() or not list(out.glob("*.parquet"))
    # the same through start()'s own arguments, and a query that dropped the region columns
    with pytest.raises(RegionalConfigError, match=r"(?i)'pathh' is not an option"):
        regional_stream(spark, inp, ck).writeStream.start(str(out), format="regional", target="delta",
                                                          pathh=str(out), checkpointLocation=str(ck))
    with pytest.raises(RegionalConfigError, match="needs the columns 'region' and 'offset'"):
        (regional_stream(spark, inp, ck).select("value").writeStream.format("regional").option("target", "delta")
         .option("path", str(out)).option("checkpointLocation", str(ck)).start())
    assert not (ck / "offsets").exists()


def test_unsafe_region_directory_is_refused(spark, dirs):
    inp, out, ck = dirs
    add_epoch_of_files(inp, ["a"], "001", 3)
    add_file(inp, "bad\nname", "001.txt", ["x"])
    message = run_until_error(start_to_delta(regional_stream(spark, inp, ck), out, ck))
    assert "region directory 'bad\\nname'" in message and "control characters" in message
    assert not out.exists()


def test_region_directory_linking_outside_the_source_is_refused(spark, dirs, tmp_path):
    inp, out, ck = dirs
    add_epoch_of_files(inp, ["a"], "001", 3)
    add_file(tmp_path / "elsewhere", "secret", "001.txt", ["x"])
    (inp / "sneaky").symlink_to(tmp_path / "elsewhere" / "secret")
    message = run_until_error(start_to_delta(regional_stream(spark, inp, ck), out, ck))
    assert "region directory 'sneaky' links to" in message
    assert not out.exists()


def test_corrupt_store_record_stops_the_query_and_publishes_nothing(spark, dirs):
    inp, out, ck = dirs
    add_epoch_of_files(inp, ["a", "b"], "001", 3)
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck)
    query.processAllAvailable()
    query.stop()
    before = table_rows(out)
    record = ck / "regional" / "epochs" / "000000000000.json"
    backup = record.read_bytes()
    record.write_text('{"version": 1, "epoch": 0, "kind": "glo')
    more = add_epoch_of_files(inp, ["a", "b"], "002", 3)
    message = run_until_error(start_to_delta(regional_stream(spark, inp, ck), out, ck))
    assert "000000000000.json is corrupt" in message and "Restore the file from a backup" in message
    assert table_rows(out) == before
    with pytest.raises(regional.RegionalStoreError, match="corrupt"):
        regional.status(ck)
    # repaired from the backup, the query goes on: nothing lost, nothing twice
    record.write_bytes(backup)
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck)
    query.processAllAvailable()
    query.stop()
    assert_exactly_once_in_order(out, expected_rows(merge({"a": ["a-001-0", "a-001-1", "a-001-2"],
                                                           "b": ["b-001-0", "b-001-1", "b-001-2"]}, more)))


def test_empty_files_hold_no_records_and_shift_no_offsets(spark, dirs):
    inp, out, ck = dirs
    first = add_epoch_of_files(inp, ["a", "b"], "001", 3)
    add_file(inp, "a", "002.txt", [])
    add_file(inp, "c", "001.txt", [])  # a region whose only file is empty
    last = add_epoch_of_files(inp, ["a", "b"], "003", 2)
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck)
    query.processAllAvailable()
    query.stop()
    assert_exactly_once_in_order(out, expected_rows(merge(first, last)))


def test_a_file_that_changes_after_it_was_counted_fails_the_query_naming_it(spark, dirs):
    """A file written under its final name (or appended to) while the query runs: its lines' offsets would
    move under records already published."""
    inp, out, ck = dirs
    inputs = add_epoch_of_files(inp, ["a", "b"], "001", 3)
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck)
    try:
        query.processAllAvailable()
        with open(inp / "a" / "001.txt", "a") as f:
            f.write("late-1\nlate-2\n")
        add_epoch_of_files(inp, ["b"], "002", 1)  # new work, so the source lists again
        message = run_until_error(query)
    finally:
        query.stop()
    assert "file '001.txt' of region 'a' changed after its lines were counted" in message, message[-2000:]
    assert "rename it when it is complete" in message
    assert_exactly_once_in_order(out, expected_rows(inputs))  # nothing of the changed file read twice or shifted


def test_the_store_deleted_mid_run_stops_the_query_clearly_and_publishes_nothing_twice(spark, dirs):
    import shutil

    inp, out, ck = dirs
    inputs = add_epoch_of_files(inp, ["a", "b"], "001", 3)
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck)
    try:
        query.processAllAvailable()
        # Renamed away first: the running query writes into its store while rmtree walks it (a flaky
        # "Directory not empty" in CI).
        (ck / "regional").rename(ck / ".regional-removed")
        shutil.rmtree(ck / ".regional-removed")
        add_epoch_of_files(inp, ["a", "b"], "002", 3)
        message = run_until_error(query)
    finally:
        query.stop()
    assert "the store was removed or replaced" in message or "was damaged" in message, message[-2000:]
    assert_exactly_once_in_order(out, expected_rows(inputs))
    # and a restart on the same checkpoint refuses too, rather than reading everything again
    message = error_of(lambda: start_to_delta(regional_stream(spark, inp, ck), out, ck))
    assert "the store was removed or replaced" in message or "was damaged" in message, message[-2000:]
    assert_exactly_once_in_order(out, expected_rows(inputs))


def test_source_and_sink_on_different_stores_fail_before_any_data_moves(spark, dirs, tmp_path):
    inp, out, ck = dirs
    add_epoch_of_files(inp, ["a"], "001", 3)
    message = error_of(lambda: start_to_delta(regional_stream(spark, inp, tmp_path / "other-ck"), out, ck))
    assert "would not share one store. Give checkpointLocation once, on writeStream" in message
    assert not out.exists() and not (ck / "offsets").exists()


def test_a_setting_given_on_both_sides_with_two_values_is_refused_before_any_data_moves(spark, dirs):
    inp, out, ck = dirs
    add_epoch_of_files(inp, ["a"], "001", 3)
    message = error_of(lambda: start_to_delta(regional_stream(spark, inp, ck, regionAttempts="1"), out, ck,
                                              regionAttempts="2"))
    assert "regionAttempts is given twice with different values" in message
    assert ".option('regionAttempts', '1')" in message and ".option('regionAttempts', '2')" in message
    assert not out.exists() and not (ck / "offsets" / "0").exists()


def test_a_setting_given_only_on_write_stream_rules_the_first_epoch(spark, dirs):
    inp, out, ck = dirs
    add_epoch_of_files(inp, ["a"], "001", 3)
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck, regionAttempts="3", maxFailureRatio="0.75")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    plan = (ck / "offsets" / "0").read_text().splitlines()[2]
    assert '"region_attempts":3' in plan.replace(" ", "") and '"max_failure_ratio":0.75' in plan.replace(" ", "")


def test_register_on_a_session_without_the_shim_says_in_one_line_what_is_off_and_how_to_get_it():
    import subprocess
    import sys

    from integration.conftest import ROOT

    result = subprocess.run([sys.executable, "-m", "integration.no_shim_child"], cwd=ROOT, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    logged = [line.removeprefix("LOGGED: ") for line in result.stdout.splitlines() if line.startswith("LOGGED: ")]
    assert len(logged) == 1 and "\n" not in logged[0], logged
    assert "the JVM shim is not on the driver's classpath" in logged[0]
    assert ".config('spark.jars'" in logged[0] and "regional.local_spark()" in logged[0]
    assert "offset-log keep-alive of referenced epochs" in logged[0]
    assert "STATE: ShimState(loaded=False" in result.stdout


@pytest.mark.campaign
def test_a_100_mb_line_is_one_record(spark, dirs):
    """A record as large as a whole file: read, published and checked like any other (about a minute)."""
    inp, out, ck = dirs
    big = "x" * (100 * 2**20)
    add_file(inp, "a", "001.txt", ["a-first", big, "a-last"])
    inputs = add_epoch_of_files(inp, ["b"], "001", 3)
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    rows = {(r, o): v for r, o, v in table_rows(out)}
    assert len(rows) == 6 and rows[("a", 1)] == big.upper() and rows[("a", 2)] == "A-LAST"
    assert [rows[("b", i)] for i in range(3)] == [v.upper() for v in inputs["b"]]
