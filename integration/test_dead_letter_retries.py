"""deadLetterRetries on real Spark (local[4,4], regionAttempts 2): a record that fails alone is retried after the
backoff; one that passes on a retry is published, not dead-lettered; one that fails on every try is dead-lettered
once, its failed epochs at least the backoff apart. Region a holds two records, so its first record stands alone from
the third epoch on (epoch 1 reads [0, 1) before it is known to be alone), its neighbour read beside it (the
evidence)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.sql import functions as F

import regional
from integration.helpers import add_epoch_of_files, assert_exactly_once, regional_stream
from integration.test_dead_letters import dead_letter_rows, expected_without, start
from regional.cli.status import render
from regional.store import Store


def failing_udf(bad: str, count_dir: Path, failures: float):
    """Upper-cases; raises on ``bad`` until ``failures`` calls have failed, each failed call leaving a file in
    ``count_dir`` (a file per call: robust to Spark's task retries, which run in other Python workers)."""
    where = str(count_dir)

    @F.udf("string")
    def parse(value: str) -> str:
        if value == bad:
            seen = len(os.listdir(where))
            if seen < failures:
                open(os.path.join(where, f"{seen}-{os.getpid()}-{id(value)}"), "x").close()
                raise ValueError(f"failure {seen} of {value}")
        return value.upper()

    return parse


def alone_failures(ck: Path, region: str = "a") -> list[tuple[int, float, str]]:
    """The epochs in which ``region``'s isolated record failed alone in a try (after an earlier failure alone and
    records of its region beside it passing since) and was kept for a retry: (epoch, recorded_at, reason)."""
    return [(e.epoch, e.recorded_at, f.reason) for e in regional.status(ck).epochs
            if (f := e.fallen_back.get(region)) is not None and "times, each after records" in f.reason]


# Campaign-only until these have passed once: rewritten for issue 45's notion of a try under a load where none ran.
pytestmark = pytest.mark.campaign


def test_a_record_that_fails_alone_twice_then_passes_within_its_retries_is_published_not_dead_lettered(
        spark, dirs, tmp_path):
    """deadLetterRetries=2: a-001-0 fails in the epoch that reads all of a and in the one that reads it without its
    neighbour (2 attempts each), then alone beside its probe in five epochs (2 attempts each: two failures before its
    first try, the try, one failure, the second try), then passes on its third try. Without retries it would be
    dead-lettered on its first try."""
    inp, out, ck = dirs
    dlq, counts = tmp_path / "dead-letters", tmp_path / "counts"
    counts.mkdir()
    inputs = {**add_epoch_of_files(inp, ["a"], "001", 2), **add_epoch_of_files(inp, ["b", "c"], "001", 20)}
    parse = failing_udf(inputs["a"][0], counts, failures=14)
    df = regional_stream(spark, inp, ck)
    query = start(df.select("region", "offset", parse("value").alias("value")), out, ck, deadLetterPath=str(dlq),
                  deadLetterRetries="2", deadLetterRetryBackoff="2s")
    try:
        query.processAllAvailable()
    finally:
        query.stop()

    assert_exactly_once(out, expected_without(inputs, set()), spark)  # every record, a-001-0 too, exactly once
    assert not dead_letter_rows(dlq)
    st = regional.status(ck)
    assert not any(e.dead_lettered for e in st.epochs)
    failed = alone_failures(ck)
    assert len(failed) == 2 and all(f"offset 0 failed alone {n} of 3 times, each after records of its region beside "
                                    "it passed (deadLetterRetries=2); retried after " in r
                                    for n, (_, _, r) in zip((1, 2), failed, strict=True)), failed
    assert failed[1][1] - failed[0][1] >= 2.0
    passed = [e for e in st.epochs if "a" in e.committed and e.committed["a"].start == 0]
    assert len(passed) == 1 and passed[0].recorded_at - failed[1][1] >= 2.0
    a = st.regions["a"]
    assert (a.committed_offset, a.dead_letters, a.failed_alone, a.state.value) == (2, 0, 0, "ok")
    assert len(os.listdir(counts)) == 14


def test_a_record_that_fails_on_every_try_is_dead_lettered_once_after_the_backoff_and_available_now_waits(
        spark, dirs, tmp_path):
    """deadLetterRetries=1, backoff 4s, Trigger.AvailableNow: the query does not end while the retry is pending (it
    would, with 'nothing new', leaving the record behind); the record is dead-lettered once, on its second failure
    alone, at least 4 s after the first; everything else is published once."""
    inp, out, ck = dirs
    dlq, counts = tmp_path / "dead-letters", tmp_path / "counts"
    counts.mkdir()
    inputs = {**add_epoch_of_files(inp, ["a"], "001", 2), **add_epoch_of_files(inp, ["b", "c"], "001", 20)}
    parse = failing_udf(inputs["a"][0], counts, failures=float("inf"))
    df = regional_stream(spark, inp, ck)
    writer = (df.select("region", "offset", parse("value").alias("value")).writeStream.format("regional")
              .option("target", "delta").option("path", str(out)).option("checkpointLocation", str(ck))
              .option("keepRegionColumns", "true").option("deadLetterPath", str(dlq))
              .option("deadLetterRetries", "1").option("deadLetterRetryBackoff", "4s").trigger(availableNow=True))
    query = writer.start()
    try:
        assert query.awaitTermination(240), "the AvailableNow query did not end"
        assert query.exception() is None, query.exception()
    finally:
        query.stop()

    assert_exactly_once(out, expected_without(inputs, {("a", 0)}), spark)
    letters = dead_letter_rows(dlq)
    assert [(r["region"], r["offset"], r["value"]) for r in letters] == [("a", 0, inputs["a"][0])]
    assert letters[0]["error"].startswith("ValueError: failure ") and letters[0]["error"].endswith(inputs["a"][0])
    st = regional.status(ck)
    failed = alone_failures(ck)
    dead = [(e.epoch, e.recorded_at) for e in st.epochs if e.dead_lettered]
    assert len(failed) == 1 and len(dead) == 1 and dead[0][1] - failed[0][1] >= 4.0, (failed, dead)
    assert "failed alone 1 of 2 times" in failed[0][2]
    a = st.regions["a"]
    assert (a.committed_offset, a.dead_letters, a.failed_alone) == (2, 1, 0)
    assert "failed alone" not in render(st).split("\n  epoch")[0]  # nothing waits any more


def test_a_restart_during_the_wait_keeps_the_tries_and_a_shorter_backoff_shortens_it(spark, dirs, tmp_path):
    """Run 1 (backoff 1 hour) is stopped gracefully while a-001-0 waits for its retry (``regional.stop`` returns
    False at once: only a retry is behind); the tries so far and the failure's time are in the epoch record. Run 2
    (backoff 1s) retries it at once: its second failure alone dead-letters it (deadLetterRetries=1); every other
    record is published once, in both runs together."""
    import time

    inp, out, ck = dirs
    dlq, counts = tmp_path / "dead-letters", tmp_path / "counts"
    counts.mkdir()
    inputs = {**add_epoch_of_files(inp, ["a"], "001", 2), **add_epoch_of_files(inp, ["b", "c"], "001", 20)}
    parse = failing_udf(inputs["a"][0], counts, failures=float("inf"))

    def run(backoff: str):
        df = regional_stream(spark, inp, ck)
        return start(df.select("region", "offset", parse("value").alias("value")), out, ck,
                     deadLetterPath=str(dlq), deadLetterRetries="1", deadLetterRetryBackoff=backoff)

    query = run("1 hour")
    try:
        deadline = time.monotonic() + 180
        while not (Store(ck).epochs() and alone_failures(ck)):
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.2)
        time.sleep(2)  # the source is now waiting for the retry (at most 10 s a plan), empty epochs meanwhile
        waiting = regional.status(ck)
        assert waiting.retry("a") is not None and waiting.retry("a")[:2] == (1, 2)
        assert waiting.retry("a")[2] > time.time() + 3000  # an hour after the failure
        assert "failed alone 1 of 2 tries; next try at" in render(waiting)
        stopped_at = time.monotonic()
        done = regional.stop(query, timeout=60)  # graceful: a final epoch for the others, not for the waiting record
        assert done is False and time.monotonic() - stopped_at < 30  # the wait holds up neither stop
    finally:
        if query.isActive:
            query.stop()
    assert not dead_letter_rows(dlq)

    query = run("1s")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly_once(out, expected_without(inputs, {("a", 0)}), spark)
    assert [(r["region"], r["offset"]) for r in dead_letter_rows(dlq)] == [("a", 0)]
    failed = alone_failures(ck)
    dead = [e.recorded_at for e in regional.status(ck).epochs if e.dead_lettered]
    assert len(failed) == 1 and len(dead) == 1 and dead[0] - failed[0][1] >= 1.0
