"""Dead letters on real Spark (local[4,4]): a UDF raises on poison records; each poison record is isolated by
bisection and lands in the dead-letter Delta table, everything else in the target, each exactly once."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

import regional
from integration.helpers import (
    add_epoch_of_files,
    add_file,
    assert_exactly_once,
    poison_udf,
    regional_stream,
    run_until_error,
    table_rows,
)
from regional.cli.status import render
from regional.store import Store

REGIONS = ["a", "b", "c", "d", "e"]
ROWS = 120


def start(df, out, ck, target="delta", **options):
    writer = (df.writeStream.format("regional").option("target", target).option("path", str(out))
              .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true"))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def dead_letter_rows(dlq: Path) -> list[dict]:
    if not (dlq / "_delta_log").is_dir():
        return []
    return sorted(DeltaTable(str(dlq)).to_pyarrow_table().to_pylist(), key=lambda r: (r["region"], r["offset"]))


def expected_without(inputs: dict[str, list[str]], poison: set[tuple[str, int]]) -> dict[str, list[tuple[int, str]]]:
    return {r: [(o, v.upper()) for o, v in enumerate(values) if (r, o) not in poison] for r, values in inputs.items()}


def test_poison_records_are_isolated_to_the_record_while_healthy_regions_flow(spark, dirs, tmp_path, caplog):
    """Two poison records in one region among 120 (a), poison at the first and last offset of a slice (b), both
    regions at once; c, d, e are healthy."""
    inp, out, ck = dirs
    dlq = tmp_path / "dead-letters"
    inputs = add_epoch_of_files(inp, REGIONS, "001", ROWS)
    poison = {("a", 37), ("a", 90), ("b", 0), ("b", ROWS - 1)}
    bad_values = {inputs[r][o] for r, o in poison}

    parse = poison_udf(bad_values)
    df = regional_stream(spark, inp, ck)
    caplog.set_level(logging.WARNING, logger="regional")
    query = start(df.select("region", "offset", parse("value").alias("value")), out, ck,
                  deadLetterPath=str(dlq))
    try:
        query.processAllAvailable()
    finally:
        query.stop()

    assert_exactly_once(out, expected_without(inputs, poison), spark)
    letters = dead_letter_rows(dlq)
    assert [(r["region"], r["offset"], r["value"]) for r in letters] == sorted((r, o, inputs[r][o]) for r, o in poison)
    assert all(r["error"] == f"ValueError: poison record {r['value']}" for r in letters), letters
    st = regional.status(ck)
    epochs = st.epochs
    dead = [(r, d.offset, e.epoch) for e in epochs for r, d in e.dead_lettered.items()]
    assert sorted((r, o) for r, o, _ in dead) == sorted(poison)
    assert {(r["region"], r["offset"], r["epoch"]) for r in letters} == set(dead)
    # The healthy regions committed everything in epoch 0 and no epoch was forced. An epoch aborts only when a and
    # b, the only regions with work then, both fail: that is an outage by the rule (poison needs evidence), and
    # the isolation goes on through it.
    assert {r: (s.start, s.end) for r, s in epochs[0].committed.items()} == {r: (0, ROWS) for r in "cde"}
    assert all(e.kind.value in ("global", "regional") or set(e.fallen_back) == {"a", "b"} for e in epochs), [
        describe(e) for e in epochs]
    assert not any("forced" in (e.reason or "") for e in epochs)
    # O(log n): each poison record costs at most its documented bound (benchmarks.dead_letters.bound, here with
    # deadLetterRetries=0): its first failure, ceil(log2(120)) epochs of bisection, then 2 x (0 + 1) + 1 epochs with
    # the record alone (fails alone, its probe passes, fails alone: the evidence rule). a's two records are found
    # one after the other (b's two meanwhile); then epoch 0, and one epoch for the rest of a after its last letter.
    # Counted in the epochs where the region had work: an epoch in which a waits out its suspect's back-off (1 s,
    # 2 s...) and only b is planned is no step of a's, and how many of those come depends on the machine's speed.
    per_poison = 1 + math.ceil(math.log2(ROWS)) + 2 * (0 + 1) + 1
    for region in "ab":
        worked = [e for e in epochs if region in e.committed or region in e.fallen_back or region in e.dead_lettered]
        assert len(worked) <= 1 + 2 * per_poison + 1, (region, "\n".join(describe(e) for e in epochs))
    assert {r: (s.dead_letters, s.isolating, s.committed_offset) for r, s in st.regions.items() if r in "ab"} == {
        "a": (2, None, ROWS), "b": (2, None, ROWS)}
    assert "dead" in render(st) and "offset 37 dead-lettered: ValueError: poison record a-001-37" in render(st)
    logged = [m for m in caplog.messages if "dead-lettered to" in m]
    assert len(logged) == len(poison), logged
    print(f"\ndead letters: {len(poison)} poison records isolated in {len(epochs)} epochs")


def describe(e):
    from regional.store.model import describe as one_line

    return one_line(e)


def test_a_record_that_fails_only_sometimes_is_published_not_dead_lettered(spark, dirs, tmp_path):
    """Transient: a-001-50 fails its first three times (two attempts of the whole range: quarantined; then once
    in its half), then succeeds; the python target (JSON lines) receives it like any other."""
    inp, out, ck = dirs
    dlq = tmp_path / "dead-letters"
    counts = tmp_path / "counts"
    counts.mkdir()
    inputs = add_epoch_of_files(inp, ["a", "b"], "001", ROWS)
    flaky = inputs["a"][50]
    count_dir = str(counts)

    @F.udf("string")
    def parse(value: str) -> str:
        if value == flaky:
            seen = len(os.listdir(count_dir))
            if seen < 3:
                open(os.path.join(count_dir, str(seen)), "w").close()
                raise ValueError(f"flaky failure {seen} of {value}")
        return value.upper()

    df = regional_stream(spark, inp, ck)
    query = start(df.select("region", "offset", parse("value").alias("value")), out, ck,
                  target="python:integration.faults:JsonLinesTarget", deadLetterPath=str(dlq))
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert len(os.listdir(count_dir)) == 3  # it failed three times
    epochs = regional.status(ck).epochs
    assert any(e.fallen_back.get("a") and e.fallen_back["a"].quarantined for e in epochs)  # isolation began
    assert not any(e.dead_lettered for e in epochs) and not dead_letter_rows(dlq)
    import json

    rows = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]
    got = sorted((r["region"], r["offset"], r["value"]) for r in rows)
    assert got == sorted((r, o, v.upper()) for r, values in inputs.items() for o, v in enumerate(values))


@pytest.mark.campaign  # 285 s loaded, keeping CI within its time
def test_sigkill_of_the_driver_while_it_dead_letters_then_restart_lands_every_record_once(tmp_path):
    """The query is SIGKILLed twice: once after an epoch's intent holds a dead letter and before it is published,
    then, on restart, while that epoch is finished (the dead letter published, the target not yet). The third
    run goes to the end: every record in exactly one of the two tables, once, in order."""
    from integration.helpers import run_killable

    inp, out, ck, dlq, marker = (tmp_path / n for n in ("in", "out", "ck", "dead", "reached"))
    inputs = add_epoch_of_files(inp, ["a", "b", "c"], "001", 16)
    poison = {("a", 5), ("b", 11)}
    args = ["integration.dead_letter_child", str(inp), str(out), str(ck), str(dlq),
            *(inputs[r][o] for r, o in poison)]
    assert run_killable(args, "before_dead_letters:*", marker) == "killed"
    interrupted = regional.status(ck).epochs[-1].epoch + 1
    intent = Store(ck).read_intent(interrupted)
    assert intent is not None and intent.dead_letters and not dead_letter_rows(dlq)
    assert run_killable(args, "after_dead_letters:*", marker) == "killed"
    # The interrupted epoch's dead letters are published once, before the target's commit.
    assert sorted(r["region"] for r in dead_letter_rows(dlq)) == sorted(intent.dead_letters)
    assert [e.epoch for e in regional.status(ck).epochs][-1] == interrupted - 1  # not recorded yet
    assert run_killable(args, None, marker) == "finished"

    assert_exactly_once(out, expected_without(inputs, poison))
    letters = dead_letter_rows(dlq)
    assert [(r["region"], r["offset"], r["value"]) for r in letters] == sorted((r, o, inputs[r][o]) for r, o in poison)
    assert all(r["error"] == f"ValueError: poison record {r['value']}" for r in letters)
    # the killed runs' files that were never added are gone (swept at the latest when the query starts again)
    held = {Path(u).name for u in DeltaTable(str(dlq)).file_uris()}
    assert sorted(p.name for p in dlq.glob("*.parquet")) == sorted(held)


def test_a_poison_kafka_message_is_dead_lettered_with_its_key_and_the_rest_reach_postgres(spark, kafka, postgres,
                                                                                        tmp_path):
    from integration.test_kafka_source import expected, kafka_stream, new_topic, produce

    topic = new_topic(kafka, 3)
    produce(kafka, topic, 3, 40, "m")
    ck, dlq, table = tmp_path / "ck", tmp_path / "dead", f"dead_letters_{os.getpid()}"
    poisoned = f"{topic}-1"
    bad = "m-1-17"

    @F.udf("string")
    def parse(value: bytes) -> str:
        text = value.decode()
        if text == bad:
            raise ValueError(f"cannot parse {text}")
        return text.upper()

    df = kafka_stream(spark, kafka, ck, topic)
    query = (df.select("region", "offset", parse("value").alias("value")).writeStream.format("regional")
             .option("target", "postgres").option("url", postgres.url).option("table", table)
             .option("keepRegionColumns", "true").option("checkpointLocation", str(ck))
             .option("deadLetterPath", str(dlq)).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    want = {r: [(o, v.upper()) for o, v in records if (r, v) != (poisoned, bad)]
            for r, records in expected(kafka, topic).items()}
    with postgres.connect() as conn:
        rows = conn.execute(f'SELECT region, "offset", value FROM {table} ORDER BY region, "offset"').fetchall()
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0] == 0
    assert rows == sorted((r, o, v) for r, records in want.items() for o, v in records)
    [letter] = dead_letter_rows(dlq)
    assert (letter["region"], letter["offset"], letter["value"], letter["key"]) == (poisoned, 17, bad.encode(), b"k17")
    assert (letter["topic"], letter["partition"], letter["error"]) == (topic, 1, f"ValueError: cannot parse {bad}")
    assert letter["timestamp"] is not None and letter["epoch"] >= 1
    assert regional.status(ck).regions[poisoned].committed_offset == 40


def test_explode_and_filter_are_normal_input_never_poison(spark, dirs, tmp_path):
    """Several rows per offset (explode) and none (filter) reach the target, each exactly once in offset order;
    nothing is quarantined or dead-lettered. Before the fix, the sink's own order check fired on the exploded
    offset, counted as an upstream failure, and "y,z" went to the dead-letter table."""
    inp, out, ck = dirs
    dlq = tmp_path / "dead-letters"
    add_file(inp, "a", "001.txt", ["x", "y,z", "drop", "w,v,u"])
    add_file(inp, "b", "001.txt", ["p", "q,r"])
    df = regional_stream(spark, inp, ck)
    exploded = (df.select("region", "offset", F.explode(F.split("value", ",")).alias("value"))
                .where(F.col("value") != "drop"))
    query = start(exploded, out, ck, deadLetterPath=str(dlq))
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    landed = sorted(table_rows(out))
    assert landed == [("a", 0, "x"), ("a", 1, "y"), ("a", 1, "z"), ("a", 3, "u"), ("a", 3, "v"), ("a", 3, "w"),
                      ("b", 0, "p"), ("b", 1, "q"), ("b", 1, "r")]
    assert dead_letter_rows(dlq) == []
    st = regional.status(ck)
    assert {r: s.committed_offset for r, s in st.regions.items()} == {"a": 4, "b": 2}
    assert all(s.state.value == "ok" and s.dead_letters == 0 for s in st.regions.values())
    assert all(not e.fallen_back for e in st.epochs)


def test_rows_reordered_between_source_and_sink_fail_the_query_and_dead_letter_nothing(spark, dirs, tmp_path):
    """An operator that reorders a region's rows breaks the sink's contract: the query fails with an error naming
    it, at the first epoch, instead of quarantining the region and dead-lettering healthy records."""
    inp, out, ck = dirs
    dlq = tmp_path / "dead-letters"
    add_file(inp, "a", "001.txt", [f"a{i}" for i in range(5)])
    def reverse(batches):  # a narrow operator that reorders (Spark refuses sorts on streams)
        for b in batches:
            yield b.take(list(range(b.num_rows - 1, -1, -1)))

    df = regional_stream(spark, inp, ck)
    df = df.mapInArrow(reverse, df.schema)
    message = run_until_error(start(df, out, ck, deadLetterPath=str(dlq)))
    assert "out of offset order" in message and "reorders rows" in message
    assert dead_letter_rows(dlq) == []
    assert not (out / "_delta_log").exists() or table_rows(out) == []
    assert Store(ck).epochs() == []
