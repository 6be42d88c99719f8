"""Bounded queries never finish partially; a graceful stop leaves nothing to replay;
committers and the listener hear about every epoch region by region."""

from __future__ import annotations

import json
import threading
import time

import pytest
from pyspark.sql import functions as F

import regional
from integration.helpers import (
    add_epoch_of_files,
    assert_exactly_once_in_order,
    expected_rows,
    merge,
    regional_stream,
    start_to_delta,
    table_rows,
    wait_for_epochs,
)
from regional.inputs.generator import generated_value

REGIONS = ["a", "b", "c", "d"]
FLAKY = "python:integration.faults:FlakyDelta"


def test_available_now_ends_only_after_the_failing_region_healed(spark, dirs, tmp_path):
    inp, out, ck = dirs
    down = tmp_path / "c-down"
    down.touch()
    inputs = add_epoch_of_files(inp, REGIONS, "001", 9)
    df = regional_stream(spark, inp, ck, maxRecordsPerRegion="3")
    writer = (df.selectExpr("region", "offset", "upper(value) AS value").writeStream.format("regional")
              .option("target", FLAKY).option("failRegion", "c").option("failWhileExists", str(down))
              .option("path", str(out)).option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
              .trigger(availableNow=True))
    healed_at = []
    query_over = threading.Event()

    def others_done_an_epoch_ago() -> bool:
        """The other regions published everything, and an epoch more was recorded since: a run that would end
        without c has ended by then (no fixed wait: issue 57)."""
        epochs = regional.status(ck).epochs if (ck / "regional").exists() else []
        done = [i for i, e in enumerate(epochs)
                if all(r in e.regions and e.regions[r].committed_offset == 9 for r in REGIONS if r != "c")]
        return bool(done) and len(epochs) > done[0] + 1

    def heal() -> None:
        while not others_done_an_epoch_ago():
            if query_over.wait(0.2):  # the query failed or was stopped: nothing left to heal
                return
        healed_at.append(time.monotonic())
        down.unlink()

    healer = threading.Thread(target=heal)
    query = writer.start()
    healer.start()
    try:
        assert query.awaitTermination(240), "AvailableNow query did not end"
    finally:
        query.stop()
        query_over.set()
        healer.join()
    ended_at = time.monotonic()
    assert query.exception() is None
    assert healed_at and ended_at >= healed_at[0]
    epochs = regional.status(ck).epochs
    assert any("c" in e.fallen_back for e in epochs), [(e.epoch, e.kind, e.fallen_back) for e in epochs]
    assert epochs[-1].kind in ("global", "forced_global") and epochs[-1].whole
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)
    # new input after the run is not read by that run
    assert all(s.committed_offset == 9 for s in regional.status(ck).regions.values())


@pytest.mark.smoke
def test_bounded_generator_ends_by_itself_after_everything_is_published(spark, tmp_path):
    out, ck = tmp_path / "out", tmp_path / "ck"
    df = (spark.readStream.format("regional").option("source", "generator").option("regions", "3")
          .option("rowsPerEpoch", "10").option("totalRows", "30").option("checkpointLocation", str(ck)).load())
    query = (df.selectExpr("region", "offset", "upper(value) AS value").writeStream.format("regional")
             .option("target", FLAKY).option("failRegion", "g001").option("failEpochs", "1,2,3")
             .option("path", str(out)).option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
             .start())
    try:
        assert query.awaitTermination(180), "the bounded query did not end by itself"
    finally:
        query.stop()
    epochs = regional.status(ck).epochs
    # in epoch 3 only g001 has work left, so its failure is the whole epoch's (maxFailureRatio)
    assert [e.kind for e in epochs[1:4]] == ["regional", "regional", "aborted"]
    assert all(set(e.fallen_back) == {"g001"} for e in epochs[1:4])
    assert epochs[-1].whole
    regions = [f"g{i:03d}" for i in range(3)]
    assert_exactly_once_in_order(out, {r: [generated_value(r, o).upper() for o in range(30)] for r in regions})


def test_graceful_stop_then_restart_reads_exactly_the_rest(spark, dirs, tmp_path):
    """The stop's forced-global path runs for real: d is still down when the stop is asked for, so
    the final epoch must wait for it (tier 2 aborts), and it heals only after such an epoch."""
    inp, out, ck = dirs
    down = tmp_path / "d-down"
    down.touch()
    inputs = add_epoch_of_files(inp, REGIONS, "001", 40)

    def run(per_epoch: str = "4"):
        df = regional_stream(spark, inp, ck, maxRecordsPerRegion=per_epoch)
        return start_to_delta(df, out, ck, target=FLAKY, failRegion="d", failWhileExists=str(down))

    query = run()
    wait_for_epochs(query, ck, 3)
    assert regional.status(ck).regions["d"].state == "fallen_back"
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(regional.stop(query, timeout=120)))
    stopper.start()
    deadline = time.monotonic() + 120
    while not any(e.kind == "aborted" and "graceful stop" in (e.reason or "") for e in regional.status(ck).epochs):
        assert time.monotonic() < deadline, "no forced-global epoch was tried while d was down"
        time.sleep(0.1)
    down.unlink()  # d heals only now: the final epoch is the forced-global one
    stopper.join(150)
    assert stopped == [True] and not query.isActive
    before = regional.status(ck)
    final = before.epochs[-1]
    assert final.kind == "forced_global" and "graceful stop" in final.reason and final.whole
    published = {r: s.committed_offset for r, s in before.regions.items()}
    assert all(0 < n < 40 for n in published.values())

    query = run(per_epoch="16")  # the rest in fewer epochs (at most 36 left a region: three at most)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    after = regional.status(ck).epochs[len(before.epochs):]
    first_starts = {r: s.start for r, s in after[0].committed.items()}
    assert first_starts == published  # the restart starts exactly where the stop left off
    read_after = {r: sum(e.committed[r].end - e.committed[r].start for e in after if r in e.committed)
                  for r in REGIONS}
    assert read_after == {r: 40 - published[r] for r in REGIONS}
    assert_exactly_once_in_order(out, expected_rows(inputs))


def test_stop_that_cannot_finish_says_so_and_the_restart_replays_only_the_unpublished(spark, dirs, tmp_path,
                                                                                         caplog):
    inp, out, ck = dirs
    down = tmp_path / "d-down"
    down.touch()
    inputs = add_epoch_of_files(inp, REGIONS, "001", 8)

    def run():
        df = regional_stream(spark, inp, ck, maxRecordsPerRegion="4")
        return start_to_delta(df, out, ck, target=FLAKY, failRegion="d", failWhileExists=str(down),
                              maxConsecutiveFailures="100")

    query = run()
    wait_for_epochs(query, ck, 2)
    with caplog.at_level("WARNING", logger="regional"):
        assert regional.stop(query, timeout=5) is False
    assert "no final global epoch within 5s (regions behind: d)" in caplog.text
    assert not query.isActive
    down.unlink()
    query = run()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly_once_in_order(out, expected_rows(inputs))


def test_committer_and_listener_hear_every_epoch_region_by_region(spark, dirs, tmp_path):
    inp, out, ck = dirs
    log = tmp_path / "notifications.jsonl"
    inputs = add_epoch_of_files(inp, REGIONS, "001", 6)
    df = regional_stream(spark, inp, ck, maxRecordsPerRegion="2")
    query = start_to_delta(df, out, ck, target="python:integration.faults:NotifiedDelta",
                           failRegion="b", failEpochs="1,2", notifyLog=str(log))
    try:
        query.processAllAvailable()
        deadline = time.monotonic() + 10  # the listener hears of progress a little later
        metrics = None
        while time.monotonic() < deadline:
            metrics = regional.listener_for(spark).metrics.get(str(query.id))
            if metrics and metrics.epoch == regional.status(ck).epochs[-1].epoch:
                break
            time.sleep(0.2)
    finally:
        query.stop()
    st = regional.status(ck)
    heard = [json.loads(line) for line in log.read_text().splitlines()]
    assert [h["epoch"] for h in heard] == [e.epoch for e in st.epochs]
    for h, e in zip(heard, st.epochs, strict=True):
        assert h["committed"] == {r: [s.start, s.end] for r, s in e.committed.items()}
        assert h["fallen_back"] == {r: [f.ref_epoch, f.reason] for r, f in e.fallen_back.items()}
    assert heard[1]["fallen_back"]["b"][0] == 0 and "shard of region b is down" in heard[1]["fallen_back"]["b"][1]
    assert "b" not in heard[1]["committed"] and set(heard[1]["committed"]) == {"a", "c", "d"}
    assert st.regional_epochs == 2 and metrics is not None
    assert metrics.regional_epochs == 2 and metrics.oldest_ref_epoch is None
    assert metrics == regional.progress(query)
    assert (metrics.fallen_back, metrics.quarantined, metrics.max_lag, metrics.regions) == (0, 0, 0, 4)
    assert_exactly_once_in_order(out, expected_rows(inputs))


def test_available_now_run_again_in_the_same_session_reads_what_was_added(spark, dirs):
    """A scheduled job or a notebook re-runs a bounded query right after the last run ended, with new files in
    between: each run reads what is new (rows after three runs 2, 4, 6). The listener's late word on an earlier
    run ("everything published: stop it") used to stop the next run of the same query before it read anything."""
    inp, out, ck = dirs
    counts, inputs = [], []
    for run in range(3):
        inputs.append(add_epoch_of_files(inp, ["a", "b"], f"{run:03d}", 1))
        query = (regional_stream(spark, inp, ck).selectExpr("region", "offset", "upper(value) AS value")
                 .writeStream.format("regional").option("target", "delta").option("path", str(out))
                 .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(180), "AvailableNow query did not end"
        assert query.exception() is None
        counts.append(len(table_rows(out)))
    assert counts == [2, 4, 6]
    assert_exactly_once_in_order(out, expected_rows(merge(*inputs)), spark)


def test_available_now_with_region_timeout_ends_only_when_every_cut_rest_is_published(spark, dirs):
    """Bounded means whole: a region cut by regionTimeout in what was planned as the final epoch still has the rest
    of its range to publish; the query must not end before it is published. (4 KB records, more than the buffers
    between source and sink hold, so that the source's cut bites: see test_upstream_failures.)"""
    inp, out, ck = dirs
    inputs = add_epoch_of_files(inp, ["fast"], "001", 100)
    inputs |= add_epoch_of_files(inp, ["slow"], "001", 7000, pad=4000)

    @F.udf("string")
    def model(region: str, value: str) -> str:
        if region == "slow":
            time.sleep(0.001)  # seven seconds for the whole range: seven times the timeout
        return value.upper()

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        query = (regional_stream(spark, inp, ck).select("region", "offset", model("region", "value").alias("value"))
                 .writeStream.format("regional").option("target", "delta").option("path", str(out))
                 .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
                 .option("regionTimeout", "1s").trigger(availableNow=True).start())
        assert query.awaitTermination(600), "AvailableNow query did not end"
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert query.exception() is None
    epochs = regional.status(ck).epochs
    assert epochs[0].committed["slow"].cut  # the final planned epoch cut the slow region...
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)  # ...and the query ended only when all landed
