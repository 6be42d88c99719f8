"""Poison resolved in bounded time, whatever its neighbours (issue 55), on real Spark and Delta: a bad file before a
good one, a filter before the UDF that hides the neighbours, and a region of nothing but bad records, which stops
the query at ``suspectTimeout`` with an error that says what to do, then drains with ``onSuspectTimeout=deadLetter``.
Before issue 55 the first two waited for ever ("records of its region beside it failed too") and so did the third.

The shared session sets ``deadLetterRetries=0``: a record is proven poison by one sandwich (a failure alone, a
witness that writes rows, a failure alone), which is what these tests are about."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

import regional
from integration.helpers import add_file, assert_exactly_once, poison_udf, regional_stream
from integration.test_dead_letters import dead_letter_rows


def bounded(df, out: Path, ck: Path, dlq: Path, **options: str):
    writer = (df.writeStream.format("regional").option("target", "delta").option("path", str(out))
              .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
              .option("deadLetterPath", str(dlq)))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.trigger(availableNow=True).start()


# one at a time: 49 s idle (2026-11-28), about 4 epochs of seconds per bad line; as a set: about 60 s
@pytest.mark.parametrize(("bad", "together", "sets"), [(2, "1", [(0, 1), (1, 1)]), (10, "16", [(0, 10)])],
                         ids=["one-at-a-time", "as-one-set"])
def test_a_bad_file_then_a_good_file_every_bad_line_dead_lettered_by_proof(spark, dirs, tmp_path, bad, together,
                                                                           sets):
    """Situation 1: region a gets a file of malformed lines, then a file of good ones; b is healthy. The first bad
    line has no neighbour that passes nearby (the next is bad too): the good file testifies, from the end of the
    region. The bounded query ends, each bad line dead-lettered once (each row with its own error), every good line
    published once. One at a time (suspectsTogether=1), each line needs its own proof; with suspectsTogether (issue
    55), the lines tried alone side by side that failed in every epoch their suspect did go together, in one epoch,
    on one proof."""
    inp, out, ck = dirs
    dlq = tmp_path / "dead"
    bad_lines, good_lines = [f"a-bad-{i}" for i in range(bad)], ["a-good-0", "a-good-1", "a-good-2"]
    add_file(inp, "a", "001.txt", bad_lines)
    add_file(inp, "a", "002.txt", good_lines)
    add_file(inp, "b", "001.txt", ["b-0", "b-1", "b-2"])
    df = regional_stream(spark, inp, ck)
    query = bounded(df.select("region", "offset", poison_udf(set(bad_lines))("value").alias("value")), out, ck, dlq,
                    suspectsTogether=together)
    assert query.awaitTermination(240), "the bounded query did not end"
    assert query.exception() is None, query.exception()
    assert_exactly_once(out, {"a": [(bad + i, v.upper()) for i, v in enumerate(good_lines)],
                              "b": [(i, f"B-{i}") for i in range(3)]}, spark)
    letters = dead_letter_rows(dlq)
    assert [(r["region"], r["offset"], r["value"]) for r in letters] == [("a", i, v) for i, v in enumerate(bad_lines)]
    assert [r["error"].splitlines()[-1] for r in letters] == [f"ValueError: poison record {v}" for v in bad_lines]
    assert all("onSuspectTimeout" not in r["error"] for r in letters), "proven, not decided by the policy"
    proven = [(d.offset, d.count) for e in regional.status(ck, epochs=1000).epochs for d in e.dead_lettered.values()]
    assert proven == sets, proven


# 35 s idle (2026-11-28)
def test_a_filter_before_the_udf_hides_no_witness(spark, dirs, tmp_path):
    """Situation 2: only `order` events reach the parser (a where before the UDF), 6 offsets apart; one order is
    malformed. Its nearest neighbours pass and write no row (clicks); probes further along hold orders that do."""
    inp, out, ck = dirs
    dlq = tmp_path / "dead"
    events = [f"order-{i}" if i % 6 == 0 else f"click-{i}" for i in range(40)]
    bad = "order-18"
    add_file(inp, "a", "001.txt", events)
    df = regional_stream(spark, inp, ck)
    orders = df.where(F.col("value").startswith("order"))
    query = bounded(orders.select("region", "offset", poison_udf({bad})("value").alias("value")), out, ck, dlq)
    assert query.awaitTermination(240), "the bounded query did not end"
    assert query.exception() is None, query.exception()
    assert_exactly_once(out, {"a": [(i, v.upper()) for i, v in enumerate(events)
                                    if v.startswith("order") and v != bad]}, spark)
    assert [(r["region"], r["offset"], r["value"]) for r in dead_letter_rows(dlq)] == [("a", 18, bad)]


# 56 s idle (2026-11-28): a 12 s bound, then a restart
def test_a_region_of_only_bad_records_stops_at_the_bound_then_drains_with_the_dead_letter_policy(spark, dirs, tmp_path):
    """A region whose only two records are both bad has no witness: before issue 55 its bounded query never ended.
    With suspectTimeout=12s the query stops with regional's error (the region, the offset, what to set) and no
    record is dead-lettered; the healthy region is published meanwhile. Started again with
    onSuspectTimeout=deadLetter, both bad records are dead-lettered, saying why, and the query ends."""
    inp, out, ck = dirs
    dlq = tmp_path / "dead"
    add_file(inp, "a", "001.txt", ["a-bad-0", "a-bad-1"])
    add_file(inp, "b", "001.txt", ["b-0", "b-1", "b-2"])
    parse = poison_udf({"a-bad-0", "a-bad-1"})

    def run(**options: str):
        df = regional_stream(spark, inp, ck)
        return bounded(df.select("region", "offset", parse("value").alias("value")), out, ck, dlq,
                       suspectTimeout="12s", **options)

    query = run()
    with pytest.raises(StreamingQueryException) as stopped:
        query.awaitTermination(240)
    error = str(stopped.value)
    assert "RegionalSuspectTimeoutError" in error or "suspectTimeout=12s" in error, error
    assert "region 'a'" in error and "offset 0" in error and "deadLetterOn" in error, error
    assert "onSuspectTimeout=deadLetter" in error and "outageOn" in error, error
    assert dead_letter_rows(dlq) == []
    assert_exactly_once(out, {"b": [(i, f"B-{i}") for i in range(3)]}, spark)
    st = regional.status(ck)
    assert st.regions["a"].committed_offset == 0 and st.resolved_by("a") is not None

    query = run(onSuspectTimeout="deadLetter")
    assert query.awaitTermination(240), "the bounded query did not end"
    assert query.exception() is None, query.exception()
    letters = dead_letter_rows(dlq)
    assert [(r["region"], r["offset"]) for r in letters] == [("a", 0), ("a", 1)]
    assert all("dead-lettered by onSuspectTimeout=deadLetter" in r["error"] for r in letters)
    assert_exactly_once(out, {"b": [(i, f"B-{i}") for i in range(3)]}, spark)

