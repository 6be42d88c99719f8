"""Failures Spark cannot catch in the sink: a poisoned UDF, a killed Python worker, a slow region."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from pyspark.sql import functions as F

import regional
from integration.helpers import (
    add_epoch_of_files,
    assert_exactly_once_in_order,
    expected_rows,
    regional_stream,
    task_files_left,
    wait_for_epochs,
    without_daemon_broken_pipes,
)

REGIONS = ["a", "b", "c", "d"]


def start(df, out, ck, **options):
    writer = (df.writeStream.format("regional").option("target", "delta").option("path", str(out))
              .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true"))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def straggler_udf(slow: str = "slow", per_record_s: float = 0.001):
    """An upper-casing UDF that sleeps ``per_record_s`` on every record of region ``slow``: a straggler."""

    @F.udf("string")
    def model(region: str, value: str) -> str:
        if region == slow:
            time.sleep(per_record_s)
        return value.upper()

    return model


def run_with_region_timeout(spark, dirs, model, per_region: int) -> list:
    """Run the files in ``dirs`` through ``model`` with regionTimeout=1s until all are published; the epochs."""
    inp, out, ck = dirs
    df = regional_stream(spark, inp, ck, maxRecordsPerRegion=str(per_region))
    query = start(df.select("region", "offset", model("region", "value").alias("value")), out, ck,
                  regionTimeout="1s")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return regional.status(ck).epochs


def slices_of(epochs, region: str) -> list[int]:
    """How many offsets ``region`` committed in each epoch that committed any."""
    return [e.committed[region].end - e.committed[region].start for e in epochs if region in e.committed]


def test_poisoned_udf_quarantines_its_region_until_the_cause_is_gone(spark, dirs, tmp_path):
    inp, out, ck = dirs
    poison = tmp_path / "poison"
    poison.touch()
    marker = str(poison)
    inputs = add_epoch_of_files(inp, REGIONS, "001", 12)

    @F.udf("string")
    def enrich(region: str, value: str) -> str:
        if region == "c" and value == "c-001-5" and os.path.exists(marker):
            raise ValueError(f"cannot parse poisoned record {value}")
        return value.upper()

    df = regional_stream(spark, inp, ck, maxRecordsPerRegion="3")
    query = start(df.select("region", "offset", enrich("region", "value").alias("value")), out, ck)
    try:
        wait_for_epochs(query, ck, 4)  # c's slice [3, 6) holds the poison from epoch 1 on
        poisoned = regional.status(ck)
        assert poisoned.regions["c"].state == "quarantined"
        assert poisoned.regions["c"].committed_offset == 3 and poisoned.regions["c"].ref_epoch == 0
        poison.unlink()
        query.processAllAvailable()
    finally:
        query.stop()
    epochs = regional.status(ck).epochs
    quarantined = [e for e in epochs if "c" in e.fallen_back]
    assert quarantined and all(e.fallen_back["c"].quarantined for e in quarantined)
    assert all(e.kind == "regional" and {"a", "b", "d"} <= set(e.committed) for e in quarantined[:3])
    # The shim's SparkListener names the UDF's own exception as the reason, in the record and in the CLI.
    for e in quarantined:
        assert "ValueError: cannot parse poisoned record c-001-5" in e.fallen_back["c"].reason, e.fallen_back
    shown = subprocess.run([sys.executable, "-m", "regional", "status", str(ck)], capture_output=True, text=True)
    assert shown.returncode == 0 and "ValueError: cannot parse poisoned record c-001-5" in shown.stdout
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)
    assert regional.status(ck).regions["c"].state == "ok"
    print(f"\nquarantine: c was quarantined in {len(quarantined)} epochs; "
          f"the query ran {len(epochs)} epochs in all")


def test_a_killed_python_worker_is_a_plain_retry(spark, dirs, tmp_path):
    inp, out, ck = dirs
    once = str(tmp_path / "killed-once")
    inputs = add_epoch_of_files(inp, REGIONS, "001", 20)

    @F.udf("string")
    def fragile(region: str, value: str) -> str:
        if region == "b" and not os.path.exists(once):
            open(once, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # the executor's Python worker dies mid-task
        return value.upper()

    df = regional_stream(spark, inp, ck)
    query = start(df.select("region", "offset", fragile("region", "value").alias("value")), out, ck)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert os.path.exists(once)
    epochs = regional.status(ck).epochs
    assert [e.kind for e in epochs] == ["global"]
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)


def test_region_timeout_publishes_prefixes_of_a_slow_region(spark, dirs):
    inp, out, _ck = dirs
    inputs = add_epoch_of_files(inp, ["fast1", "fast2"], "001", 40000)
    # 4 KB records, like documents sent to a model: a backlog of 12,000 of them is more than the
    # buffers between source and sink hold (about 5,000 of them measured), so the source's cut bites.
    inputs |= add_epoch_of_files(inp, ["slow"], "001", 12000, pad=4000)
    model = straggler_udf()  # the whole backlog takes twelve seconds: twelve times the timeout

    # The sink takes rows in Arrow batches of maxRecordsPerBatch (10,000 by default): what is in
    # flight when the deadline passes includes one such batch, so slow per-row work wants them small.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        epochs = run_with_region_timeout(spark, dirs, model, per_region=20000)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    prefixes = slices_of(epochs, "slow")
    assert sum(prefixes) == 12000
    assert len(prefixes) >= 2 and prefixes[0] < 12000, f"the slow region was not cut: {prefixes}"
    assert slices_of(epochs, "fast1") == [20000, 20000]
    assert [e.epoch for e in epochs if "fast1" in e.committed] == [0, 1]  # the fast regions did not wait
    assert all(not e.fallen_back for e in epochs)
    assert_exactly_once_in_order(out, expected_rows(inputs))
    print(f"\nregionTimeout: slow region prefixes per epoch {prefixes}")


def test_region_timeout_sizes_a_stragglers_next_ranges_to_the_timeout(spark, dirs):
    """Small records: the straggler's whole range fits in the buffers between source and sink, so the
    source's cut saves nothing; its next ranges are sized to what it did per regionTimeout instead, and the
    healthy regions keep their ranges."""
    inp, out, _ck = dirs
    inputs = add_epoch_of_files(inp, ["fast1", "fast2"], "001", 6000)
    inputs |= add_epoch_of_files(inp, ["slow"], "001", 5000)
    model = straggler_udf()  # 2,000 records (its first range): two seconds, twice the timeout
    epochs = run_with_region_timeout(spark, dirs, model, per_region=2000)
    slices = slices_of(epochs, "slow")
    assert slices[0] == 2000 and sum(slices) == 5000
    assert all(n < 2000 for n in slices[1:]), f"the straggler's later ranges were not sized down: {slices}"
    assert slices_of(epochs, "fast1") == [2000, 2000, 2000]
    assert all(not e.fallen_back for e in epochs)
    assert_exactly_once_in_order(out, expected_rows(inputs))


@pytest.mark.campaign  # 49 s idle, keeping CI within its time
def test_a_quarantined_region_prints_regional_lines_not_stack_traces(tmp_path):
    """A poisoned UDF is a fault regional handles: its retries and quarantine print regional's own lines,
    not Spark's task-abort errors with the Python traceback (sessions built by regional.configure)."""
    from integration.conftest import ROOT

    result = subprocess.run([sys.executable, "-m", "integration.poison_child", str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    # At spark.stop(), pyspark's daemon may print a BrokenPipeError for an idle worker it closes over a Unix
    # domain socket (regional's local sessions use them: README, "configure"); nothing else may print.
    output = without_daemon_broken_pipes(result.stdout)
    assert "child done: c is quarantined" in result.stdout
    assert "region 'c' quarantined at attempt 2" in output
    for noise in ("Traceback", "\tat ", "Exception", "Aborting task"):
        assert noise not in output, f"{noise!r} printed:\n{output[-3000:]}"


def test_task_files_of_failed_attempts_and_older_epochs_are_removed(spark, dirs):
    """Region a's first attempt fails in every epoch (a UDF that raises on attempt 0); its retry publishes. The
    read receipts each attempt leaves in SPARK_LOCAL_DIRS, and each epoch's directory, are gone at the end."""
    inp, out, ck = dirs
    inputs = add_epoch_of_files(inp, ["a", "b"], "001", 9)

    @F.udf("string")
    def first_attempt_fails(region: str, value: str) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if region == "a" and context is not None and context.attemptNumber() == 0:
            raise ConnectionError("first attempt fails")
        return value.upper()

    df = regional_stream(spark, inp, ck, maxRecordsPerRegion="3")
    query = start(df.select("region", "offset", first_attempt_fails("region", "value").alias("value")), out, ck)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly_once_in_order(out, expected_rows(inputs))
    assert len(regional.status(ck).epochs) >= 3
    assert task_files_left(spark, str(query.id)) == []
