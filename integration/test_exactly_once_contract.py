"""The two ordinary configurations that lost records before the per-epoch contract (issue 9),
on real Spark and real Delta tables, checked record by record."""

from __future__ import annotations

import os
import shutil

from pyspark.sql import functions as F

import regional
from integration.helpers import (
    add_epoch_of_files,
    assert_exactly_once_in_order,
    expected_rows,
    regional_stream,
    start_to_delta,
)

REGIONS = ["a", "b", "c"]


def test_region_attempts_on_read_stream_only_never_commits_an_unread_range(spark, dirs, tmp_path):
    """regionAttempts=1 given on readStream only; b's UDF fails once (transient). The retry is the
    quarantine attempt: it reads nothing, so b must fall back, not be recorded as written."""
    inp, out, ck = dirs
    flaky = tmp_path / "b-fails-once"
    flaky.touch()
    marker = str(flaky)
    inputs = add_epoch_of_files(inp, REGIONS, "001", 10)

    @F.udf("string")
    def enrich(region: str, value: str) -> str:
        if region == "b" and os.path.exists(marker):
            os.unlink(marker)  # fails on the first attempt only
            raise ConnectionError("lookup service hiccup")
        return value.upper()

    df = regional_stream(spark, inp, ck, regionAttempts="1")
    query = (df.select("region", "offset", enrich("region", "value").alias("value")).writeStream
             .format("regional").option("target", "delta").option("path", str(out))
             .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true").start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert not flaky.exists(), "the transient failure was never injected"
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)
    epochs = regional.status(ck).epochs
    assert epochs[0].fallen_back["b"].quarantined and epochs[0].kind == "regional"


def test_a_wiped_checkpoint_is_a_new_query_whose_epochs_are_published(spark, tmp_path):
    """The same checkpoint path and table, the checkpoint wiped in between: the new query's epochs
    0, 1, ... must not be skipped as already published by the old query."""
    out, ck = tmp_path / "out", tmp_path / "ck"
    first_in, second_in = tmp_path / "in1", tmp_path / "in2"
    first = add_epoch_of_files(first_in, REGIONS, "001", 6)
    second = add_epoch_of_files(second_in, REGIONS, "002", 6)
    for inp in (first_in, second_in):
        query = start_to_delta(regional_stream(spark, inp, ck, maxRecordsPerRegion="2"), out, ck)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        if inp == first_in:
            old_query = regional.status(ck)
            assert len(old_query.epochs) == 3
            shutil.rmtree(ck)  # wiped; the path is reused
    assert len(regional.status(ck).epochs) == 3
    # each run read its own input from offset 0: the table holds both, each record exactly once
    rows = spark.read.format("delta").load(str(out)).select("region", "offset", "value").collect()
    got = sorted((r.region, r.offset, r.value) for r in rows)
    want = sorted((r, o, v.upper()) for part in (first, second) for r, values in part.items()
                  for o, v in enumerate(values))
    assert got == want


# A script that ends with its query still running and without spark.stop() exits cleanly: the last run of
# test_postgres_target's test_sigkill_of_the_driver_at_each_step_of_phase_two_then_a_restart is such a script (it
# was test_a_script_that_ends_without_stopping_exits_cleanly here, a child driver of its own).


def test_the_demo_is_quiet_and_ends_with_its_check(tmp_path):
    """What a new user sees first: no dependency-resolution wall, no stack traces for the fault the demo
    injects, one screen, the verification line last."""
    import subprocess
    import sys

    from integration.conftest import ROOT

    result = subprocess.run([sys.executable, "-m", "regional.demo", "--dir", str(tmp_path / "demo")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    lines = (result.stdout + result.stderr).strip().splitlines()  # not one daemon BrokenPipeError either
    assert result.returncode == 0, "\n".join(lines[-40:])
    assert len(lines) <= 60, "\n".join(lines)
    assert result.stdout.strip().splitlines()[-1].startswith("OK: the Delta table")
    for noise in ("Traceback", "Exception", "\tat ", "resolving dependencies", ":: retrieving ::"):
        assert not any(noise in line for line in lines), "\n".join(lines)
    target_failures = [line for line in lines if "failed in the target" in line]
    assert len(target_failures) == 2 and all(line.startswith("regional: epoch") for line in target_failures)
