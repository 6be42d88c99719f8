"""Replaying dead letters on real Spark (local[4,4]) into real Delta tables: a poison record dead-lettered, the
UDF fixed, the replay run with Trigger.AvailableNow (``source=deadLetters``): the target then holds each record
exactly once, wherever it came from; a record that still fails goes to the replay's own dead letters; a second
replay of the same table takes nothing, as the table's marks say."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from integration.helpers import add_epoch_of_files, assert_exactly_once, error_of, poison_udf, regional_stream
from regional.dead_letters import open_table, query_table, summary
from regional.location import parse_location
from regional.store import Store
from regional.testing.exactly_once import check, delta_landed

REGIONS = ["a", "b", "c"]
ROWS = 60


def run_to_delta(df, out: Path, ck: Path, dlq: Path, available_now: bool = False) -> None:
    writer = (df.writeStream.format("regional").option("target", "delta").option("path", str(out))
              .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
              .option("deadLetterPath", str(dlq)))
    if available_now:
        query = writer.trigger(availableNow=True).start()
        try:
            assert query.awaitTermination(300), "the replay did not end"
            assert query.exception() is None, query.exception()
        finally:
            query.stop()
        return
    query = writer.start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def replay_stream(spark, dlq: Path, ck: Path):
    return (spark.readStream.format("regional").option("source", "deadLetters").option("path", str(dlq))
            .option("checkpointLocation", str(ck)).load())


def letters(dlq: Path) -> list[dict]:
    """The table's rows, through delta-rs's DataFusion (pyarrow's reader of a table delta-rs updated can abort the
    process at exit)."""
    table = open_table(parse_location("dlq", str(dlq)))
    if table is None:
        return []
    rows = query_table(table, "SELECT * FROM dead_letters").to_pylist()
    return sorted(rows, key=lambda r: (r["region"], r["offset"]))


@pytest.mark.campaign  # 174 s idle, keeping CI within its time
def test_replay_after_a_fix_lands_each_record_exactly_once_and_a_second_replay_adds_nothing(spark, tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    dlq, dlq_replay, dlq_again, dlq_last = (tmp_path / n for n in ("dlq", "dlq-replay", "dlq-again", "dlq-last"))
    inputs = add_epoch_of_files(inp, REGIONS, "001", ROWS)
    poison = {("a", 17), ("a", 41), ("b", 0)}
    value = {(r, o): inputs[r][o] for r, o in poison}
    everything = {r: [(o, v.upper()) for o, v in enumerate(values)] for r, values in inputs.items()}

    # 1. The query with the bug: three poison records dead-lettered, the rest in the target.
    parse = poison_udf(set(value.values()))
    df = regional_stream(spark, inp, tmp_path / "ck")
    run_to_delta(df.select("region", "offset", parse("value").alias("value")), out, tmp_path / "ck", dlq)
    assert [(r["region"], r["offset"]) for r in letters(dlq)] == sorted(poison)
    assert_exactly_once(out, {r: [(o, v) for o, v in rows if (r, o) not in poison] for r, rows in everything.items()})
    found = summary(str(dlq))
    assert (found.records, found.replayed, found.error_classes) == (3, 0, {"ValueError": 3})
    assert {r: g.waiting for r, g in found.regions.items()} == {"a": 2, "b": 1}

    # 2. The fix, but for a-17: the replay runs the same select into the same target. a-41 and b-0 land; a-17,
    # the first dead letter of its region, fails again and goes to the replay's own dead letters (its probe of the
    # records after it reads a-41, which passes: evidence).
    still = poison_udf({value[("a", 17)]})
    ck_replay = tmp_path / "ck-replay"
    run_to_delta(replay_stream(spark, dlq, ck_replay).select("region", "offset", still("value").alias("value")),
                 out, ck_replay, dlq_replay, available_now=True)
    replay_id = Store(str(ck_replay)).query_id()
    landed = {r: [(o, v) for o, v in rows if (r, o) != ("a", 17)] for r, rows in everything.items()}
    report = check(landed, delta_landed(out))
    assert not (report.lost or report.duplicated or report.wrong), report.explain()
    again = letters(dlq_replay)
    assert [(r["region"], r["offset"], r["value"]) for r in again] == [("a", 17, value[("a", 17)])]
    assert again[0]["error"] == f"ValueError: poison record {value[('a', 17)]}"
    assert set(again[0]) == {"region", "offset", "value", "epoch", "error"}  # the source's columns, epoch, error
    # The table says which records were replayed, by which query and epoch.
    marks = {(r["region"], r["offset"]): (r["replayed_by"], r["replayed_epoch"], r["replayed_as"])
             for r in letters(dlq)}
    store = Store(str(ck_replay))
    records = [store.read_record(e) for e in store.epochs()]
    published = {(r, o): e.epoch for e in records for r, s in e.committed.items() for o in range(s.start, s.end)}
    dead = {(r, d.offset): e.epoch for e in records for r, d in e.dead_lettered.items()}
    assert marks == {("a", 41): (replay_id, published[("a", 41)], "published"),
                     ("b", 0): (replay_id, published[("b", 0)], "published"),
                     ("a", 17): (replay_id, dead[("a", 17)], "dead-lettered")}
    assert summary(str(dlq)).replayed == 3

    # 3. A second replay of the same table (a new checkpoint, the UDF fixed): it takes only what is new: nothing.
    before = DeltaTable(str(out)).version()
    fixed = F.upper(F.col("value")).alias("value")
    run_to_delta(replay_stream(spark, dlq, tmp_path / "ck-again").select("region", "offset", fixed), out,
                 tmp_path / "ck-again", dlq_again, available_now=True)
    assert [x for x in delta_landed(out) if x.published > before] == []  # no row landed
    report = check(landed, delta_landed(out))
    assert not (report.lost or report.duplicated or report.wrong), report.explain()
    assert letters(dlq_again) == []
    assert {(r["region"], r["offset"]): (r["replayed_by"], r["replayed_epoch"], r["replayed_as"])
            for r in letters(dlq)} == marks

    # 4. The replay's own dead letters, replayed once fixed: now the target holds every record exactly once.
    run_to_delta(replay_stream(spark, dlq_replay, tmp_path / "ck-last").select("region", "offset", fixed), out,
                 tmp_path / "ck-last", dlq_last, available_now=True)
    report = check(everything, delta_landed(out))
    assert not (report.lost or report.duplicated or report.wrong), report.explain()
    assert sorted(tuple(r) for r in spark.read.format("delta").load(str(out)).collect()) == sorted(
        (r, o, v) for r, rows in everything.items() for o, v in rows)
    assert letters(dlq_last) == []


def test_a_replay_refuses_its_own_table_as_its_dead_letters_and_a_table_that_is_not_one(spark, tmp_path):
    inp, out, dlq = tmp_path / "in", tmp_path / "out", tmp_path / "dlq"
    inputs = add_epoch_of_files(inp, ["a", "b"], "001", 10)
    parse = poison_udf({inputs["a"][3]})
    df = regional_stream(spark, inp, tmp_path / "ck")
    run_to_delta(df.select("region", "offset", parse("value").alias("value")), out, tmp_path / "ck", dlq)
    assert len(letters(dlq)) == 1

    ck = tmp_path / "ck-replay"
    message = error_of(lambda: replay_stream(spark, dlq, ck).writeStream.format("regional")
                       .option("target", "delta").option("path", str(tmp_path / "out2"))
                       .option("checkpointLocation", str(ck)).option("deadLetterPath", str(dlq)).start())
    assert "is this query's own input" in message, message
    with pytest.raises(Exception, match="not a regional dead-letter table"):
        replay_stream(spark, out, tmp_path / "ck-2").schema  # noqa: B018 - the schema is what fails
    with pytest.raises(Exception, match="no Delta table"):
        replay_stream(spark, tmp_path / "nothing", tmp_path / "ck-3").schema  # noqa: B018


def test_a_replay_reads_and_marks_a_dead_letter_table_on_s3(s3):
    """The dead-letter source on object storage (s3proxy): the table written as the coordinator writes it, read
    back and marked through delta-rs with the session's storage settings, and summarised by the CLI's code."""
    import pyarrow as pa

    from regional.dead_letters import dead_letter_rows, encode_records
    from regional.inputs import load_input
    from regional.inputs.files import SCHEMA
    from regional.store.model import EpochKind, EpochRecord, RegionState, Slice
    from regional.targets import dead_letter_target

    table = f"{s3.create_bucket('replay')}/dlq"
    for epoch, (region, offset) in enumerate([("a", 3), ("b", 1), ("a", 9)]):
        batch = pa.RecordBatch.from_pydict({"region": [region], "offset": [offset], "value": [f"{region}{offset}"]},
                                           SCHEMA)
        rows = dead_letter_rows(encode_records([batch], SCHEMA), region, offset, epoch, "ValueError: bad")
        sink = dead_letter_target(table, "original")
        sink.commit(epoch, {region: sink.prepare(epoch, region, iter(rows.to_batches()))})

    source = load_input({"source": "deadLetters", "path": table})
    store = Store(f"{s3.create_bucket('replay-ck')}/ck")
    store.open_query()
    source.use_store(store)  # type: ignore[attr-defined]
    assert source.available(0) == {"a": 10, "b": 2}
    source.before_splits(0)  # type: ignore[attr-defined]
    got = [r for b in source.read("a", 0, 10, source.split("a", 0, 10)) for r in b.to_pylist()]
    assert got == [{"region": "a", "offset": 3, "value": "a3"}, {"region": "a", "offset": 9, "value": "a9"}]
    source.on_recorded(EpochRecord(0, EpochKind.GLOBAL, {"a": Slice(0, 10, 2)}, {}, {"a": RegionState(10, 0)}))
    found = summary(table)
    assert (found.records, found.replayed, {r: g.waiting for r, g in found.regions.items()}) == (3, 2, {"a": 0, "b": 1})


@pytest.mark.campaign  # 42 s: with the topic replay's own (REGIONAL_CAMPAIGN=1), keeping CI within 30 minutes
def test_sigkill_of_the_replay_in_phase_two_and_before_its_marks_then_restart_lands_each_record_once(spark,
                                                                                                    tmp_path):
    """The replay's driver killed (SIGKILL, the whole process tree) after an epoch's record but before the table's
    marks (in the sink's phase two); restarted. The target holds every dead letter once,
    the table marks them all as replayed by the replay in the epochs that published them, and a second replay of
    the table (a new checkpoint) adds nothing."""
    from integration.helpers import run_killable

    dlq, out, ck, dlq_replay, marker = (tmp_path / n for n in ("dlq", "out", "ck", "dlq-replay", "reached"))
    records = {r: [(o, f"{r}-{o}") for o in (2, 5, 11, 12, 30)] for r in ("a", "b", "c")}
    write_dead_letters(dlq, records)
    args = ["integration.replay_child", str(dlq), str(out), str(ck), str(dlq_replay)]
    # before_record is every target's phase-two kill point (test_crash_safety.py); before_marks is the replay's.
    assert run_killable(args, "before_marks:2", marker) == "killed"
    assert summary(str(dlq)).replayed < 15  # the last kill left an epoch's records published but unmarked
    assert run_killable(args, None, marker) == "finished"

    expected = {r: [(o, v.upper()) for o, v in rows] for r, rows in records.items()}
    assert_exactly_once(out, expected)
    store = Store(str(ck))
    published = {(r, o): e.epoch for e in map(store.read_record, store.epochs())
                 for r, s in e.committed.items() for o in range(s.start, s.end)}
    marks = {(m["region"], m["offset"]): (m["replayed_by"], m["replayed_epoch"], m["replayed_as"])
             for m in letters(dlq)}
    assert marks == {(r, o): (store.query_id(), published[(r, o)], "published")
                     for r, rows in records.items() for o, _ in rows}
    assert letters(dlq_replay) == []

    before = DeltaTable(str(out)).version()
    run_to_delta(replay_stream(spark, dlq, tmp_path / "ck-again").select("region", "offset", F.upper("value")
                                                                         .alias("value")),
                 out, tmp_path / "ck-again", tmp_path / "dlq-again", available_now=True)
    assert [x for x in delta_landed(out) if x.published > before] == []


def write_dead_letters(table: Path, records: dict[str, list[tuple[int, str]]]) -> None:
    """Dead letters of the files source, one epoch per record, as the coordinator writes them."""
    import pyarrow as pa

    from regional.dead_letters import dead_letter_rows, encode_records
    from regional.inputs.files import SCHEMA
    from regional.targets import dead_letter_target

    sink = dead_letter_target(str(table), "original")
    flat = sorted(((o, r, v) for r, rows in records.items() for o, v in rows))
    for epoch, (offset, region, value) in enumerate(flat):
        batch = pa.RecordBatch.from_pydict({"region": [region], "offset": [offset], "value": [value]}, SCHEMA)
        rows = dead_letter_rows(encode_records([batch], SCHEMA), region, offset, epoch, "ValueError: bad")
        sink.commit(epoch, {region: sink.prepare(epoch, region, iter(rows.to_batches()))})
