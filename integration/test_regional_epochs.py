"""Regional epochs end to end: real Spark local[4,4], a real Delta table on disk, real faults."""

from __future__ import annotations

import json

import pytest

import regional
from integration.helpers import (
    add_epoch_of_files,
    assert_exactly_once_in_order,
    expected_rows,
    merge,
    regional_stream,
    run_epochs,
    start_to_delta,
    table_rows,
)

REGIONS = ["a", "b", "c", "d"]
FLAKY = "python:integration.faults:FlakyDelta"


@pytest.mark.smoke
def test_all_healthy_with_files_appended_between_epochs(spark, dirs):
    inp, out, ck = dirs
    inputs = add_epoch_of_files(inp, REGIONS[:3], "001", 7)
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck)
    try:
        query.processAllAvailable()
        for tag in ("002", "003"):
            inputs = merge(inputs, add_epoch_of_files(inp, REGIONS[:3], tag, 5))
            query.processAllAvailable()
        inputs = merge(inputs, add_epoch_of_files(inp, ["late-joiner"], "004", 3))  # a new region joins
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)
    st = regional.status(ck)
    kinds = [e.kind for e in st.epochs]  # 4, or more if an epoch's listing fell between two renames
    assert set(kinds) == {"global"} and len(kinds) >= 4
    assert st.regions["late-joiner"].committed_offset == 3 and st.regions["a"].committed_offset == 17
    assert all(s.state == "ok" and s.ref_epoch is None for s in st.regions.values())


def test_a_region_whose_target_is_down_keeps_its_python_worker(spark, dirs, tmp_path):
    """The sink of a region whose target fails takes the rest of its input: a Python worker that returns with
    input unread is not reused, and each epoch of a failing region then forked and imported a new one."""
    inp, out, ck = dirs
    inputs = add_epoch_of_files(inp, ["a", "b"], "001", 40)
    down, workers = tmp_path / "down", tmp_path / "workers"
    down.touch()
    query = start_to_delta(regional_stream(spark, inp, ck, maxRecordsPerRegion="2"), out, ck, target=FLAKY,
                           failRegion="a", failWhileExists=str(down), workerLog=str(workers),
                           maxConsecutiveFailures="1000")
    run_epochs(query, ck, 16)
    lines = [line.split() for line in workers.read_text().splitlines()]
    failed_epochs = {e for e, r, _pid in lines if r == "a"}
    pids = {pid for _e, _r, pid in lines}
    assert len(failed_epochs) >= 16
    # local[4,4]: at most 4 tasks at once, each with a source and a sink worker.
    assert len(pids) <= 8, f"{len(pids)} Python workers staged slices in {len(failed_epochs)} epochs"
    down.unlink()  # then the rest in one epoch: catching up 2 records an epoch is not what this test is about
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck, target=FLAKY)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly_once_in_order(out, expected_rows(inputs))


def test_failing_committer_falls_back_for_three_epochs_then_catches_up(spark, dirs):
    inp, out, ck = dirs
    inputs = add_epoch_of_files(inp, REGIONS, "001", 12)
    query = start_to_delta(regional_stream(spark, inp, ck, maxRecordsPerRegion="3"), out, ck,
                           target=FLAKY, failRegion="c", failEpochs="1,2,3")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    epochs = regional.status(ck).epochs
    assert [e.kind for e in epochs[:5]] == ["global", "regional", "regional", "regional", "global"]
    for e in epochs[1:4]:
        assert set(e.committed) == {"a", "b", "d"}  # the healthy regions publish in every epoch
        assert set(e.fallen_back) == {"c"}
        assert e.fallen_back["c"].ref_epoch == 0  # c still uses the offset epoch 0 committed
        assert "shard of region c is down" in e.fallen_back["c"].reason
        assert e.regions["c"].state == "fallen_back" and e.regions["c"].committed_offset == 3
    assert [e.regions["c"].consecutive_failures for e in epochs[1:5]] == [1, 2, 3, 0]
    # a, b, d finished in 4 epochs; c needed 3 more
    assert len(epochs) == 7
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)
    assert all(s.state == "ok" for s in regional.status(ck).regions.values())


def test_max_consecutive_failures_forces_a_global_epoch_then_the_query_goes_on(spark, dirs):
    inp, out, ck = dirs
    inputs = add_epoch_of_files(inp, REGIONS, "001", 16)
    query = start_to_delta(regional_stream(spark, inp, ck, maxRecordsPerRegion="2"), out, ck,
                           target=FLAKY, failRegion="b", failEpochs="0,1,2,3,4",
                           maxConsecutiveFailures="2")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    epochs = regional.status(ck).epochs
    kinds = [e.kind for e in epochs]
    assert kinds[:6] == ["regional", "regional", "aborted", "regional", "regional", "forced_global"]
    aborted = epochs[2]
    assert not aborted.committed and "forced global epoch failed" in aborted.reason
    assert all(s.consecutive_failures == 0 for s in aborted.regions.values())  # tier 2 resets
    assert epochs[3].regions["b"].consecutive_failures == 1
    assert set(epochs[5].committed) == set(REGIONS)
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)


def test_disabled_is_all_or_nothing_and_fails_with_the_target_error(spark, dirs):
    inp, out, ck = dirs
    first = add_epoch_of_files(inp, REGIONS, "001", 4)

    def start():
        return start_to_delta(regional_stream(spark, inp, ck), out, ck, target=FLAKY,
                              failRegion="c", failEpochs="1", enabled="false")

    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    version = table_rows(out)
    # added while no query runs, so epoch 1 holds every region's second file, c's included
    add_epoch_of_files(inp, REGIONS, "002", 4)
    query = start()
    try:
        with pytest.raises(Exception, match="shard of region c is down"):
            query.processAllAvailable()
    finally:
        query.stop()
    assert table_rows(out) == version  # nothing of epoch 1 was published
    assert_exactly_once_in_order(out, expected_rows(first))
    assert [e.epoch for e in regional.status(ck).epochs] == [0]
    assert not [p for p in out.glob("part-e00000001-*")], "staged files of the failed epoch were not aborted"


@pytest.mark.smoke
def test_a_plain_python_committer_and_region_columns_dropped_by_default(spark, dirs, tmp_path):
    inp, out, ck = dirs
    inputs = add_epoch_of_files(inp, REGIONS, "001", 5)
    query = (regional_stream(spark, inp, ck).writeStream.format("regional")
             .option("target", "python:integration.faults:JsonLinesTarget").option("path", str(out))
             .option("failRegion", "d").option("checkpointLocation", str(ck)).start())
    run_epochs(query, ck, 2)
    rec = regional.status(ck).epochs[0]
    assert rec.kind == "regional" and "cannot stage region d" in rec.fallen_back["d"].reason
    rows = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert sorted(r["value"] for r in rows) == sorted(v for r in "abc" for v in inputs[r])
    assert all(set(r) == {"value"} for r in rows)  # region and offset are not written by default
    assert not list((out / "_staging").iterdir())


def test_delta_commit_metadata_names_epoch_regions_and_fallbacks(spark, dirs):
    from deltalake import DeltaTable

    inp, out, ck = dirs
    add_epoch_of_files(inp, REGIONS, "001", 3)
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck, target=FLAKY,
                           failRegion="a", failEpochs="0")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    history = sorted((h for h in DeltaTable(str(out)).history() if "regional" in h), key=lambda h: h["version"])
    meta = history[0]["regional"]
    assert meta["epoch"] == 0 and meta["kind"] == "regional"
    assert meta["committed"]["b"] == {"start": 0, "end": 3, "rows": 3}
    assert meta["fallen_back"]["a"]["ref_epoch"] == -1
    assert history[1]["regional"]["committed"] == {"a": {"start": 0, "end": 3, "rows": 3}}


def test_a_query_that_starts_with_nothing_to_read_runs_an_empty_epoch_zero_then_reads_what_arrives(spark, dirs):
    inp, out, ck = dirs
    inp.mkdir(parents=True)
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck)
    try:
        query.processAllAvailable()  # Spark runs a new query's batch 0 even when the source has nothing
        inputs = add_epoch_of_files(inp, REGIONS[:2], "001", 4)
        query.processAllAvailable()
    finally:
        query.stop()
    epochs = regional.status(ck).epochs
    assert [(e.epoch, e.kind, sorted(e.committed)) for e in epochs] == [(0, "global", []), (1, "global", ["a", "b"])]
    assert_exactly_once_in_order(out, expected_rows(inputs), spark)
