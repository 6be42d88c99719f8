"""The JVM shim in a real session: offset-log keep-alive, plan checks, one checkpoint location."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

import regional
from integration.helpers import (
    ROOT,
    add_epoch_of_files,
    assert_exactly_once_in_order,
    expected_rows,
    merge,
    regional_stream,
    start_to_delta,
    wait_for_epochs,
)
from regional.shim_jar import build
from regional.spark.session import delta_fits_spark
from regional.store import Store

REGIONS = ["a", "b", "c", "d"]
FLAKY = "python:integration.faults:FlakyDelta"


def run_regional_epoch_then_heal(query, ck, down, region: str) -> None:
    """With ``region``'s target down, the first epoch must be regional; then heal it and drain the query."""
    try:
        wait_for_epochs(query, ck, 1)
        assert regional.status(ck).epochs[-1].kind == "regional"
        assert set(regional.status(ck).epochs[-1].fallen_back) == {region}
        down.unlink()
        query.processAllAvailable()
    finally:
        query.stop()
    assert regional.status(ck).regional_epochs >= 1


def test_the_session_has_every_shim_feature(spark):
    state = regional.shim_state(spark)
    assert state is not None and state.loaded and state.off == [], state


@pytest.fixture(scope="module")
def built_shim(tmp_path_factory) -> Path:
    """The shim compiled from its sources once for the module (scalac: 5 to 20 s)."""
    return build(out=tmp_path_factory.mktemp("shim") / "shim.jar")


def test_the_shim_builds_from_its_sources(built_shim: Path):
    names = set(zipfile.ZipFile(built_shim).namelist())
    for cls in ("RegionalShim", "RegionalCheckpointFileManager", "FailureListener", "RegionalExtensions"):
        assert f"io/regional/shim/{cls}.class" in names


@pytest.fixture(scope="module")
def earlier_runs(built_shim: Path, tmp_path_factory) -> dict[str, tuple[tuple[dict, str], Path]]:
    """The two children of the tests below, each a driver of its own over an earlier run's record (a session's
    jars and extensions are fixed at its start), run side by side: mode -> (its result, its stderr)."""
    stripped = tmp_path_factory.mktemp("stripped") / "stripped.jar"
    with zipfile.ZipFile(built_shim) as source, zipfile.ZipFile(stripped, "w") as target:
        for item in source.infolist():
            if not item.filename.endswith("setting-keys.txt"):
                target.writestr(item, source.read(item))
    modes = {"stripped": str(stripped), "unregistered": "--unregistered"}
    works = {name: tmp_path_factory.mktemp(name) for name in modes}
    children = {name: start_over_an_earlier_runs_settings(works[name], mode) for name, mode in modes.items()}
    return {name: finish(child, works[name]) for name, child in children.items()}


def test_a_run_whose_settings_the_shim_cannot_record_refuses_to_plan_rather_than_use_an_earlier_runs(earlier_runs):
    """The shim deletes the earlier run's write-options.json before it records this run's: here it cannot (its
    jar lacks setting-keys.txt, as a jar of an older build does), and the source then refuses to plan."""
    (child, stderr), _ = earlier_runs["stripped"]
    assert child["exception"] and "settings were not recorded at query start" in child["exception"], child
    assert child["earlier_record"] is False and child["published"] is False, child
    assert "setting-keys.txt" in stderr  # the shim's warning says why


def test_a_run_planned_on_an_earlier_runs_settings_stops_before_it_publishes(earlier_runs):
    """No shim and no listener (the data source registered by hand): the source plans with the earlier run's
    record; the sink finds writeStream's settings differ, records them and fails the run before its epoch."""
    (child, _), work = earlier_runs["unregistered"]
    assert child["exception"] and "planned with an earlier run's {'maxDeadLettersPerEpoch': '1'}" in child[
        "exception"], child
    assert child["published"] is False, child
    assert Store(str(work / "ck")).read_write_options() == {"maxDeadLettersPerEpoch": "7"}  # for the next run


@pytest.mark.campaign  # 39 s idle, keeping CI within its time
def test_a_second_run_whose_settings_nobody_records_plans_nothing(tmp_path):
    """The first run's record was taken by its first plan: a second run with no listener and no shim (the
    listener removed) finds no record, and refuses before it plans an epoch, rather
    than plan on the first run's settings (a planned epoch would be replayed with them after a restart)."""
    add_epoch_of_files(tmp_path / "in", ["a", "b"], "001", 3)
    result = subprocess.run([sys.executable, "-m", "integration.stale_options_child", "--second-run-unregistered",
                             str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    found = [line for line in result.stdout.splitlines() if line.startswith("CHILD-RESULT ")]
    assert found, (result.stdout[-3000:], result.stderr[-5000:])
    child = json.loads(found[0].removeprefix("CHILD-RESULT "))
    assert child["exception"] and "settings were not recorded at query start" in child["exception"], child
    first, second = child["planned"]
    assert first >= 1 and second == first, child  # the second run planned no epoch
    assert len(DeltaTable(str(tmp_path / "out")).to_pyarrow_table()) == 6  # the first run's, and no more


def start_over_an_earlier_runs_settings(work: Path, shim_jar: str) -> subprocess.Popen[str]:
    """The child, started; its output goes to files in ``work`` (two children at once never block on a pipe)."""
    add_epoch_of_files(work / "in", REGIONS, "001", 3)
    Store(str(work / "ck")).record_write_options("an-earlier-run", {"maxDeadLettersPerEpoch": "1"})
    with open(work / "stdout", "w") as out, open(work / "stderr", "w") as err:
        return subprocess.Popen([sys.executable, "-m", "integration.stale_options_child", shim_jar, str(work)],
                                cwd=ROOT, stdout=out, stderr=err, text=True)


def finish(child: subprocess.Popen[str], work: Path) -> tuple[tuple[dict, str], Path]:
    """The child's CHILD-RESULT and its stderr, and its work directory."""
    try:
        child.wait(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
    stdout, stderr = (work / "stdout").read_text(), (work / "stderr").read_text()
    found = [line for line in stdout.splitlines() if line.startswith("CHILD-RESULT ")]
    assert found, (stdout[-3000:], stderr[-5000:])
    return (json.loads(found[0].removeprefix("CHILD-RESULT ")), stderr), work


@pytest.mark.campaign  # 50 s idle, keeping CI within its time
def test_checkpoint_location_given_only_on_write_stream(spark, dirs, tmp_path):
    inp, out, ck = dirs
    down = tmp_path / "down"
    down.touch()
    inputs = add_epoch_of_files(inp, REGIONS, "001", 5)
    df = spark.readStream.format("regional").option("source", "files").option("path", str(inp)).load()
    query = start_to_delta(df, out, ck, target=FLAKY, failRegion="b", failWhileExists=str(down))
    run_regional_epoch_then_heal(query, ck, down, "b")
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)


def test_a_stateful_operator_is_refused_before_any_data_moves(spark, dirs):
    inp, out, ck = dirs
    add_epoch_of_files(inp, REGIONS, "001", 3)
    df = regional_stream(spark, inp, ck).dropDuplicates(["value"])
    with pytest.raises(Exception) as err:
        start_to_delta(df, out, ck)
    message = str(err.value)
    assert "stateful operator (Deduplicate)" in message and "dropDuplicates" in message
    assert "Move the stateful step after the regional sink" in message
    assert not out.exists() and not (ck / "offsets").exists()


def test_a_repartition_runs_all_or_nothing_epochs_and_warns_once(spark, dirs, caplog):
    inp, out, ck = dirs
    first = add_epoch_of_files(inp, REGIONS, "001", 6)
    df = regional_stream(spark, inp, ck).repartition(2)
    with caplog.at_level(logging.WARNING, logger="regional"):
        query = start_to_delta(df, out, ck)
        try:
            query.processAllAvailable()
            second = add_epoch_of_files(inp, REGIONS, "002", 4)
            query.processAllAvailable()
            time.sleep(1.0)  # the listener's progress callbacks are asynchronous
        finally:
            query.stop()
    warnings = [r.getMessage() for r in caplog.records if "regional epochs are off" in r.getMessage()]
    assert len(warnings) == 1 and "repartition(2)" in warnings[0], warnings
    epochs = regional.status(ck).epochs
    assert len(epochs) >= 2 and all(e.kind == "global" and not e.fallen_back for e in epochs)
    assert {r: s.rows for r, s in epochs[0].committed.items()} == dict.fromkeys(REGIONS, 6)
    assert_exactly_once_in_order(out, expected_rows(merge(first, second)), spark)


def test_a_broadcast_join_with_a_static_table_stays_regional(spark, dirs, tmp_path):
    inp, out, ck = dirs
    down = tmp_path / "down"
    down.touch()
    inputs = add_epoch_of_files(inp, REGIONS, "001", 5)
    names = spark.createDataFrame([(r, f"region {r}") for r in REGIONS], "region string, label string")
    df = regional_stream(spark, inp, ck).join(F.broadcast(names), "region")
    query = start_to_delta(df, out, ck, target=FLAKY, failRegion="c", failWhileExists=str(down))
    run_regional_epoch_then_heal(query, ck, down, "c")
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)


def test_the_offset_log_keeps_a_referenced_epoch_through_the_purge(spark, dirs, tmp_path):
    inp, out, ck = dirs
    down = tmp_path / "down"
    spark.conf.set("spark.sql.streaming.minBatchesToRetain", "3")
    try:
        inputs = add_epoch_of_files(inp, REGIONS, "001", 2)
        query = start_to_delta(regional_stream(spark, inp, ck, maxRecordsPerRegion="2"), out, ck, target=FLAKY,
                               failRegion="b", failWhileExists=str(down), maxConsecutiveFailures="100")
        try:
            query.processAllAvailable()  # epoch 0: every region committed; b's ref_epoch will be 0
            down.touch()
            inputs = merge(inputs, add_epoch_of_files(inp, REGIONS, "002", 16))
            # b fell back in epochs 1..7 while the others moved on: Spark's purge (keeping 3) has run past epoch 1
            wait_for_epochs(query, ck, 8)
            fallen = regional.status(ck)
            assert fallen.regions["b"].ref_epoch == 0 and fallen.epochs[-1].epoch >= 7
            logs = {d: sorted(int(p.name) for p in (ck / d).iterdir() if p.name.isdigit())
                    for d in ("offsets", "commits")}
            for d, kept in logs.items():
                assert kept[0] == 0, f"{d}/0 was purged while region b references epoch 0: {kept}"
                assert 1 not in kept, f"Spark's purge did not run on {d}: {kept}"
            down.unlink()
            query.processAllAvailable()  # b catches up; a few more epochs pass
            assert regional.status(ck).regions["b"].ref_epoch is None
            deadline = time.monotonic() + 60
            while (ck / "offsets" / "0").exists() and time.monotonic() < deadline:
                inputs = merge(inputs, add_epoch_of_files(inp, REGIONS, f"x{time.monotonic_ns()}", 1))
                query.processAllAvailable()
            assert not (ck / "offsets" / "0").exists() and not (ck / "commits" / "0").exists()
        finally:
            query.stop()
    finally:
        spark.conf.unset("spark.sql.streaming.minBatchesToRetain")
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)


@pytest.mark.skipif(not delta_fits_spark(), reason="no Delta Lake JVM for this Spark line (regional_conf)")
def test_a_stock_delta_stream_runs_untouched_beside_the_shim(spark, dirs):
    inp, out, ck = dirs
    add_epoch_of_files(inp, ["a", "b"], "001", 3)
    query = (spark.readStream.format("text").load(str(inp / "*" / "*.txt")).writeStream.format("delta")
             .option("checkpointLocation", str(ck)).trigger(availableNow=True).start(str(out)))
    query.awaitTermination()
    assert sorted(r.value for r in spark.read.format("delta").load(str(out)).collect()) == sorted(
        f"{r}-001-{i}" for r in "ab" for i in range(3))
