"""Dead letters to a Kafka topic (``deadLetterTopic``) on a real broker: each poison record in the topic exactly once
(read ``read_committed``), with its key, value and headers, and everything else in the target exactly once, whatever
re-runs and SIGKILLs of the driver around the topic's transaction."""

from __future__ import annotations

import base64
import itertools
import json
import math
import os
import re
import time
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import regional
from integration.helpers import assert_exactly_once, poison_udf, run_killable
from integration.test_kafka_source import expected, kafka_stream, new_topic, produce
from regional.store import Store
from regional.targets import dead_letter_target
from regional.targets.base import Target
from regional.targets.kafka_topic import DeadLetterTopic, KafkaDeadLetterError
from regional.testing.kafka_broker import topic_messages

_names = itertools.count()


def dead_topic() -> str:
    return f"dead.{next(_names)}-{os.getpid()}-{time.monotonic_ns()}"


def letters_in(broker, topic: str, isolation: str = "read_committed") -> list[dict[str, Any]]:
    """Every record of ``topic`` (all partitions, to their end) with its key, value and headers; [] if no topic."""
    return [{"key": m["key"], "value": m["value"], "partition": m["partition"], "position": m["offset"],
             "headers": {k: v if v is None else v.decode() for k, v in m["headers"]},
             "header_keys": [k for k, _ in m["headers"]]} for m in topic_messages(broker.bootstrap, topic, isolation)]


def sink(broker, topic: str, query_id: str = "q-test") -> DeadLetterTopic:
    target = dead_letter_target(f"kafka:{topic}", query_id, {"deadLetter.kafka.bootstrap.servers": broker.bootstrap})
    assert isinstance(target, DeadLetterTopic)
    return target


def kafka_letter(topic: str, partition: int, offset: int, value: bytes, epoch: int) -> pa.Table:
    """One dead letter's rows as ``dead_letters.dead_letter_rows`` makes them for a Kafka source."""
    return pa.table({"region": [f"{topic}-{partition}"], "offset": pa.array([offset], pa.int64()),
                     "key": pa.array([b"k%d" % offset], pa.binary()), "value": pa.array([value], pa.binary()),
                     "topic": [topic], "partition": pa.array([partition], pa.int32()),
                     "epoch": pa.array([epoch], pa.int64()), "error": [f"ValueError: cannot parse {value.decode()}"]})


def test_an_epochs_dead_letters_are_produced_once_however_often_its_commit_runs(kafka):
    """The coordinator calls commit again after a crash, from a new driver: the marker committed in the epoch's
    transaction makes every re-run produce nothing. A zombie's open transaction (same query, killed mid-way) is
    fenced and aborted by the next commit, never visible. A missing topic is created. Fails without the marker."""
    topic = dead_topic()
    first = sink(kafka, topic)
    handles = {"src-1": first.prepare(4, "src-1", iter(kafka_letter("src", 1, 17, b"m-1-17", 4).to_batches())),
               "src-2": first.prepare(4, "src-2", iter(kafka_letter("src", 2, 3, b"m-2-3", 4).to_batches()))}
    first.commit(4, handles)
    first.commit(4, handles)  # the same driver again
    sink(kafka, topic).commit(4, handles)  # a restarted driver, from the intent's handles
    letters = letters_in(kafka, topic)
    assert [(m["key"], m["value"]) for m in letters] == [(b"k17", b"m-1-17"), (b"k3", b"m-2-3")]
    headers = dict(letters[0]["headers"])
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(headers.pop("regional.schema"))))
    assert schema.names == ["region", "offset", "key", "value", "topic", "partition"]  # what a replay gives back
    assert headers == {
        "regional.error.class": "ValueError", "regional.error.message": "cannot parse m-1-17",
        "regional.region": "src-1", "regional.offset": "17", "regional.epoch": "4", "regional.query.id": "q-test",
        "regional.source.topic": "src", "regional.source.partition": "1", "regional.source.offset": "17",
        "regional.row": '{"region": "src-1", "offset": 17, "topic": "src", "partition": 1}',
        "regional.source.headers": "0"}

    # A zombie of the query: its transaction holds epoch 5's letter, produced but never committed.
    from confluent_kafka import Producer

    zombie = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": "regional-q-test-deadletters"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie")
    assert zombie.flush(30) == 0
    rows = pa.table({"region": ["a"], "offset": pa.array([9], pa.int64()), "value": ["x,y"],
                     "epoch": pa.array([5], pa.int64()), "error": ["KeyError: 'y'"]})
    later = sink(kafka, topic)
    later.commit(5, {"a": later.prepare(5, "a", iter(rows.to_batches()))})
    letters = letters_in(kafka, topic)
    assert len(letters) == 3 and b"zombie" not in [m["value"] for m in letters]
    files = letters[2]
    assert files["key"] is None and files["value"] == b'{"region": "a", "offset": 9, "value": "x,y"}'
    assert files["headers"]["regional.error.class"] == "KeyError" and "regional.source.topic" not in files["headers"]
    assert len(letters_in(kafka, topic, "read_uncommitted")) == 4  # the zombie's record is there, aborted


def test_a_store_behind_the_topics_marker_fails_and_letters_are_bounded_and_strict_json(kafka):
    """Found by a cold review. A checkpoint restored from a backup (or copied: the same query id) is behind the
    marker: its epoch's letters would be skipped silently; the commit fails instead, naming it. An error message
    that quotes a huge record is cut in the header (it would double the letter, past max.message.bytes). A NaN
    in a row is the text "NaN" in its JSON (strict parsers refuse the bare NaN token; a replay reads it back)."""
    from regional.errors import RegionalStoreError

    topic = dead_topic()
    first = sink(kafka, topic, query_id="q-restored")
    first.commit(7, {"a": first.prepare(7, "a", iter(kafka_letter("src", 0, 1, b"m-7", 7).to_batches()))})
    restored = sink(kafka, topic, query_id="q-restored")
    handles = {"a": restored.prepare(3, "a", iter(kafka_letter("src", 0, 2, b"m-3", 3).to_batches()))}
    with pytest.raises(RegionalStoreError, match="up to epoch 7, but its store is at epoch 3: the checkpoint was "
                                                 "restored from a backup or copied"):
        restored.commit(3, handles)
    assert [m["value"] for m in letters_in(kafka, topic)] == [b"m-7"]

    rows = pa.table({"region": ["a"], "offset": pa.array([9], pa.int64()), "score": pa.array([float("nan")]),
                     "epoch": pa.array([1], pa.int64()), "error": ["ValueError: " + "x" * 100_000]})
    bounded = sink(kafka, topic, query_id="q-bounded")
    bounded.commit(1, {"a": bounded.prepare(1, "a", iter(rows.to_batches()))})
    letter = next(m for m in letters_in(kafka, topic) if m["headers"]["regional.query.id"] == "q-bounded")
    assert json.loads(letter["value"]) == {"region": "a", "offset": 9, "score": "NaN"}  # as Jackson writes it
    message = letter["headers"]["regional.error.message"]
    assert len(message) < 8300 and message.endswith(" ... (cut)")


def start_with_topic(df, out, ck, dead: str, brokers: str, parse, **options: str):
    writer = (df.select("region", "offset", parse(F.col("value").cast("string")).alias("value")).writeStream
              .format("regional").option("target", "delta").option("path", str(out))
              .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
              .option("deadLetterTopic", dead).option("deadLetter.kafka.bootstrap.servers", brokers))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def check_letters(kafka, dead: str | list[str], topic: str, poison: dict[tuple[str, int], str],
                  query_id: str | None) -> list[dict[str, Any]]:
    """Each poison record in the dead-letter topic(s) exactly once (read_committed), with its key and headers."""
    letters = [m for d in ([dead] if isinstance(dead, str) else dead) for m in letters_in(kafka, d)]
    got = sorted((m["headers"]["regional.region"], int(m["headers"]["regional.offset"]), m["value"].decode())
                 for m in letters)
    assert got == sorted((r, o, v) for (r, o), v in poison.items())
    for m in letters:
        h, offset = m["headers"], int(m["headers"]["regional.offset"])
        assert m["key"] == b"k%d" % offset
        assert (h["regional.source.topic"], h["regional.source.offset"]) == (topic, str(offset))
        assert h["regional.region"] == f"{topic}-{h['regional.source.partition']}"
        assert (h["regional.error.class"], h["regional.error.message"]) == ("ValueError",
                                                                             f"poison record {m['value'].decode()}")
        assert h["regional.query.id"] == query_id and int(h["regional.epoch"]) >= 1
    return letters


@pytest.mark.campaign  # 190 s idle, keeping CI within its time
def test_sigkill_inside_and_after_the_topics_transaction_then_restart_lands_every_record_once(kafka, tmp_path):
    """Run 1 is SIGKILLed inside the dead letters' transaction (produced, not committed): read_committed sees none.
    Run 2 finishes that epoch from its intent and is SIGKILLed after the transaction, before the target's commit:
    the letters are in the topic once, the epoch not recorded. Run 3, whose options name another dead-letter topic,
    finishes it again (the intent's topic: nothing produced twice) and goes to the end: every poison record in the
    topics once, everything else in the target once."""
    topic, dead, renamed = new_topic(kafka, 3), dead_topic(), dead_topic()
    produce(kafka, topic, 3, 16, "m")
    out, ck, marker = tmp_path / "out", tmp_path / "ck", tmp_path / "reached"
    poison = {(f"{topic}-0", 5): "m-0-5", (f"{topic}-2", 11): "m-2-11"}
    args = ["integration.dead_letter_topic_child", kafka.bootstrap, topic, str(out), str(ck), dead,
            *poison.values()]

    assert run_killable(args, "dead_letters_produced:*", marker) == "killed"
    interrupted = regional.status(ck).epochs[-1].epoch + 1
    intent = Store(ck).read_intent(interrupted)
    assert intent is not None and intent.dead_letters and intent.dead_letter_topic == dead
    assert letters_in(kafka, dead) == []  # produced in the open transaction, invisible to read_committed
    assert len(letters_in(kafka, dead, "read_uncommitted")) == len(intent.dead_letters)

    assert run_killable(args, "after_dead_letters:*", marker) == "killed"
    assert [e.epoch for e in regional.status(ck).epochs][-1] == interrupted - 1  # not recorded yet
    landed = letters_in(kafka, dead)
    assert sorted(m["headers"]["regional.region"] for m in landed) == sorted(intent.dead_letters)
    assert {m["headers"]["regional.epoch"] for m in landed} == {str(interrupted)}

    args[5] = renamed  # deadLetterTopic changed between restarts
    assert run_killable(args, None, marker) == "finished"
    want = {r: [(o, v.upper()) for o, v in records if (r, o) not in poison]
            for r, records in expected(kafka, topic).items()}
    assert_exactly_once(out, want)
    check_letters(kafka, [dead, renamed], topic, poison, Store(ck).query_id())
    assert len(letters_in(kafka, dead)) == len(intent.dead_letters)  # the interrupted epoch's, in its topic, once


class _Memory(Target[Any]):
    def __init__(self) -> None:
        super().__init__()
        self.commits: dict[int, dict[str, Any]] = {}

    def prepare(self, epoch, region, batches):
        raise AssertionError("not used here")

    def commit(self, epoch, handles, report=None):
        self.commits.setdefault(epoch, dict(handles))

    def abort(self, epoch, handles):
        pass


def decided_epoch(tmp_path, topic: str):
    """A store, and epoch 2's plan and task outcomes: region a's record at offset 4 dead-lettered (dead letters to
    ``topic``), region b's slice written. Epoch 1's record holds the evidence of issue 45's rule (docs/design.md,
    "Poison or outage"): a@4 failed alone in epoch 0 and records of a beside it passed in epoch 1, so its failure
    alone in epoch 2 is a try, its last (deadLetterRetries=0)."""
    from regional.dead_letters import encode_records
    from regional.inputs.files import SCHEMA, batch_of
    from regional.protocol.decide import Outcome, TaskOutcome
    from regional.protocol.plan import RegionRange, plan_epoch
    from regional.protocol.settings import Settings
    from regional.store.model import EpochKind, EpochRecord, RegionState, Standing

    store = Store(tmp_path / "ck")
    store.open_query()
    s = Settings(dead_letter_topic=topic, region_attempts=2, dead_letter_retries=0)
    store.write_record(EpochRecord(1, EpochKind.REGIONAL, {}, {}, {"a": RegionState(
        4, None, 0, Standing.QUARANTINED, "q", isolating=(4, 5), alone_since=0, probe_passed=1)}))
    plan = plan_epoch(2, store.query_id(), str(store.checkpoint), {}, {"a": 5, "b": 8}, s)
    plan = type(plan)(plan.query_id, 2, plan.store, (RegionRange("a", 4, 5, None, True), plan.regions[1]), s)
    letter = encode_records([batch_of("a", 4, ["a-4"])], SCHEMA)
    tasks = [TaskOutcome(0, 2, Outcome.QUARANTINED, plan.query_id, "a", 4, 4, reason="q", dead_letter=letter),
             TaskOutcome(1, 0, Outcome.WRITTEN, plan.query_id, "b", 0, 8, 8, 0, 7, "b@0-8")]
    return store, plan, tasks


def test_brokers_down_in_phase_two_fail_the_query_and_record_nothing_then_the_restart_produces_once(kafka, tmp_path):
    """The dead letters' brokers do not answer when the epoch's letters go out: commit fails, naming the topic and
    the brokers (never the producer's other settings), the epoch is not recorded and its intent is kept. The
    restart, with the brokers back and deadLetterTopic renamed meanwhile, produces them once, to the intent's
    topic."""
    from regional.coordinator import commit_epoch
    from regional.protocol.settings import Settings
    from regional.testing.kafka_broker import free_port

    topic = dead_topic()
    store, plan, tasks = decided_epoch(tmp_path, topic)
    down = {"deadLetter.kafka.bootstrap.servers": f"127.0.0.1:{free_port()}", "deadLetter.timeoutMs": "3000",
            "deadLetter.kafka.sasl.password": "s3cr3t-pw"}
    target = _Memory()
    with pytest.raises(KafkaDeadLetterError) as err:
        commit_epoch(plan, tasks, store, target, dead_letter_sink=lambda p, q: dead_letter_target(p, q, down))
    assert f"deadLetterTopic={topic}" in str(err.value) and "s3cr3t" not in str(err.value)
    assert store.read_record(plan.epoch) is None and target.commits == {}
    assert store.read_intent(plan.epoch).dead_letter_topic == topic
    assert not any("s3cr3t" in p.read_text(errors="replace") for p in (tmp_path / "ck").rglob("*") if p.is_file())

    renamed = type(plan)(plan.query_id, plan.epoch, plan.store, plan.regions,
                         Settings(dead_letter_topic=dead_topic(), region_attempts=2, dead_letter_retries=0))
    up = {"deadLetter.kafka.bootstrap.servers": kafka.bootstrap}
    for _ in range(2):  # the restart, and a second one (the record is there: nothing happens)
        record = commit_epoch(renamed, tasks, store, target,
                              dead_letter_sink=lambda p, q: dead_letter_target(p, q, up))
    assert record.dead_lettered["a"].offset == 4 and target.commits == {plan.epoch: {"b": "b@0-8"}}
    [letter] = letters_in(kafka, topic)
    assert letter["value"] == b'{"region": "a", "offset": 4, "value": "a-4"}'
    assert letter["headers"]["regional.epoch"] == str(plan.epoch)
    assert letter["headers"]["regional.error.class"] == "unknown"
    assert letters_in(kafka, renamed.settings.dead_letter_topic) == []


@pytest.mark.campaign  # 20 s: the campaign command runs it (REGIONAL_CAMPAIGN=1), keeping CI within 30 minutes
def test_a_transaction_the_brokers_time_out_fails_the_commit_and_its_rerun_produces_once(kafka, monkeypatch):
    """transaction.timeout.ms shorter than the time between produce and commit (1 s; the broker checks every 10 s):
    the brokers abort the transaction; commit fails, nothing is visible, and the re-run produces the letters once.
    (The transaction spans only the dead letters' commit, never a whole epoch.)"""
    from regional import failpoints

    topic = dead_topic()
    opts = {"deadLetter.kafka.bootstrap.servers": kafka.bootstrap, "deadLetter.kafka.transaction.timeout.ms": "1000"}
    slow = dead_letter_target(f"kafka:{topic}", "q-timeout", opts)
    handles = {"src-1": slow.prepare(2, "src-1", iter(kafka_letter("src", 1, 5, b"m-1-5", 2).to_batches()))}
    monkeypatch.setattr(failpoints, "reach", lambda name, epoch: time.sleep(16))
    with pytest.raises(KafkaDeadLetterError):
        slow.commit(2, handles)
    assert letters_in(kafka, topic) == []
    monkeypatch.undo()
    dead_letter_target(f"kafka:{topic}", "q-timeout", opts).commit(2, handles)
    dead_letter_target(f"kafka:{topic}", "q-timeout", opts).commit(2, handles)
    assert [m["value"] for m in letters_in(kafka, topic)] == [b"m-1-5"]


def test_dead_letter_topic_options_are_checked_at_start(kafka):
    from regional.errors import RegionalConfigError
    from regional.spark.writer import check_dead_letter_topic

    with pytest.raises(RegionalConfigError, match=r"deadLetter\.kafka\.bootstrap\.servers"):
        check_dead_letter_topic("dead", "q", {})
    with pytest.raises(RegionalConfigError, match=r"transactional\.id"):
        check_dead_letter_topic("dead", "q", {"deadletter.kafka.bootstrap.servers": kafka.bootstrap,
                                              "deadletter.kafka.transactional.id": "mine"})
    with pytest.raises(RegionalConfigError, match="not a producer setting"):
        check_dead_letter_topic("dead", "q", {"deadletter.kafka.bootstrap.servers": kafka.bootstrap,
                                              "deadletter.kafka.no.such.setting": "1"})
    with pytest.raises(RegionalConfigError, match="is read by this query itself"):
        check_dead_letter_topic("orders.dead", "q", {"deadletter.kafka.bootstrap.servers": kafka.bootstrap},
                                ["orders-0", "orders.dead-3"])


def test_two_drivers_committing_the_same_epoch_at_once_produce_its_letters_once(kafka, monkeypatch):
    """Driver A has produced the epoch's letters in its open transaction when driver B (same query) commits the
    same epoch: B fences A (A's transaction is aborted, its commit fails) and produces them; A's failure leaves
    nothing behind."""
    from regional import failpoints

    topic = dead_topic()
    opts = {"deadLetter.kafka.bootstrap.servers": kafka.bootstrap}
    a, b = (dead_letter_target(f"kafka:{topic}", "q-two", opts) for _ in range(2))
    handles = {"src-0": a.prepare(7, "src-0", iter(kafka_letter("src", 0, 2, b"m-0-2", 7).to_batches()))}
    interleaved = []

    def b_commits_meanwhile(name, epoch):
        if not interleaved:
            interleaved.append(name)
            b.commit(epoch, handles)

    monkeypatch.setattr(failpoints, "reach", b_commits_meanwhile)
    with pytest.raises(KafkaDeadLetterError, match="fenced"):
        a.commit(7, handles)
    assert interleaved == ["dead_letters_produced"]
    assert [m["value"] for m in letters_in(kafka, topic)] == [b"m-0-2"]
    a.commit(7, handles)  # A, restarted, finds the marker
    assert [m["value"] for m in letters_in(kafka, topic)] == [b"m-0-2"]


def test_a_kafka_records_own_headers_are_kept_first_null_values_included(kafka):
    """With includeHeaders, the source record's headers (a null value too) come first, then regional's."""
    from regional.inputs.kafka import HEADERS

    topic = dead_topic()
    own = pa.array([[{"key": "trace", "value": b"t-1"}, {"key": "empty", "value": None}]], HEADERS)
    rows = kafka_letter("src", 0, 1, b"v", 3).append_column("headers", own)
    target = sink(kafka, topic)
    target.commit(3, {"src-0": target.prepare(3, "src-0", iter(rows.to_batches()))})
    [letter] = letters_in(kafka, topic)
    assert letter["header_keys"][:3] == ["trace", "empty", "regional.error.class"]
    assert (letter["headers"]["trace"], letter["headers"]["empty"]) == ("t-1", None)


# -- replaying a dead-letter topic (source=deadLetters, topic) ------------------------------------------------------


def replay_of(broker, topic: str, ck, **options: str):
    """The replay source of a query whose store is at ``ck`` (its query id names its marks)."""
    from regional.inputs import load_input
    from regional.inputs.deadletter_topic import DeadLetterTopicInput

    source = load_input({"source": "deadLetters", "topic": topic, "kafka.bootstrap.servers": broker.bootstrap,
                         **options})
    assert isinstance(source, DeadLetterTopicInput)
    store = Store(str(ck))
    store.open_query()
    source.use_store(store)
    return source


def replayed_rows(source, epoch: int, region: str, start: int, end: int) -> list[dict[str, Any]]:
    source.before_splits(epoch)
    split = source.split(region, start, end)
    return [r for b in source.read(region, start, end, split) for r in b.to_pylist()]


def commit_letters(target, epoch: int, region: str, offsets: list[int]) -> None:
    """Epoch ``epoch``'s dead letters of ``region``'s records at ``offsets`` (values ``<region>-<offset>``), committed
    to the topic by the dead-letter sink ``target``, as phase two does."""
    n = len(offsets)
    rows = pa.table({"region": [region] * n, "offset": pa.array(offsets, pa.int64()),
                     "value": [f"{region}-{o}" for o in offsets], "epoch": pa.array([epoch] * n, pa.int64()),
                     "error": pa.array(["ValueError: bad"] * n)})
    target.commit(epoch, {region: target.prepare(epoch, region, iter(rows.to_batches()))})


def recorded(epoch: int, committed: dict[str, int]):
    """Epoch ``epoch``'s record: each region of ``committed`` published up to that offset."""
    from regional.store.model import EpochKind, EpochRecord, RegionState, Slice

    return EpochRecord(epoch, EpochKind.GLOBAL, {r: Slice(0, e, e) for r, e in committed.items()}, {},
                       {r: RegionState(e, epoch) for r, e in committed.items()})


def group_marks(broker, topic: str, group: str) -> list[tuple[int, dict[str, Any]]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        return [(tp.offset, json.loads(tp.metadata or "{}"))]
    finally:
        consumer.close()


def test_a_dead_letter_topic_replays_each_letter_as_its_source_read_it_and_its_group_says_what_was_replayed(
        kafka, tmp_path):
    """The replay source over real letters (produced by the dead-letter sink, as phase two does): each row comes back
    with its source's columns and types (a Kafka record's key, value, topic, partition, timestamp and own headers;
    another source's JSON row: binary, times, decimals, lists; NaN was null). The replay group's marks: the first
    letter not replayed, and those beyond it that were (a new replay skips them). A late letter fails the replay."""
    import datetime as dt
    import decimal

    from regional.errors import RegionalStoreError
    from regional.inputs.kafka import HEADERS, SCHEMA

    # A Kafka source's letters: the rows as the Kafka source read them, region and offset first (as dead_letter_rows
    # puts every dead letter).
    spark_order = SCHEMA.append(pa.field("headers", HEADERS))
    letter_schema = pa.schema([spark_order.field("region"), spark_order.field("offset"),
                               *(f for f in spark_order if f.name not in ("region", "offset"))])
    dead = dead_topic()
    when = dt.datetime(2026, 11, 26, 1, 2, 3, 456000, tzinfo=dt.timezone.utc)
    kafka_rows = pa.table({
        "region": ["src-1", "src-2"], "offset": pa.array([17, 3], pa.int64()), "key": pa.array([b"k17", None]),
        "value": pa.array([b"m-1-17", b"\x00\xff"]), "topic": ["src", "src"],
        "partition": pa.array([1, 2], pa.int32()), "timestamp": pa.array([when, when], pa.timestamp("us", tz="UTC")),
        "timestampType": pa.array([0, 1], pa.int32()),
        "headers": pa.array([[{"key": "trace", "value": b"t-1"}, {"key": "regional.region", "value": b"x"}], None],
                            HEADERS)}, schema=letter_schema)
    letters = kafka_rows.append_column("epoch", pa.array([4, 4], pa.int64())).append_column(
        "error", pa.array(["ValueError: bad", "ValueError: bad"]))
    target = sink(kafka, dead, query_id="q-orig")
    target.commit(4, {r: target.prepare(4, r, iter(letters.filter(pa.compute.equal(letters["region"], r)).to_batches()))
                      for r in ("src-1", "src-2")})
    source = replay_of(kafka, dead, tmp_path / "ck-k")
    assert source.schema == kafka_rows.schema
    assert source.available(0) == {"src-1": 18, "src-2": 4}
    assert replayed_rows(source, 0, "src-1", 0, 18) == [kafka_rows.to_pylist()[0]]
    assert replayed_rows(source, 0, "src-2", 0, 4) == [kafka_rows.to_pylist()[1]]

    # Another source's letters: its row as JSON, typed again by the letters' schema.
    dead = dead_topic()
    fields = [("region", pa.string()), ("offset", pa.int64()), ("value", pa.string()), ("score", pa.float64()),
              ("scores", pa.list_(pa.float32())),
              ("raw", pa.binary()), ("at", pa.timestamp("us", tz="UTC")), ("day", pa.date32()),
              ("price", pa.decimal128(10, 2)), ("tags", pa.list_(pa.string()))]
    rows = pa.table({"region": ["a", "b"], "offset": pa.array([7, 3], pa.int64()), "value": ["a-7", "b-3"],
                     "score": [float("nan"), 1.5], "scores": [[float("-inf"), 2.0], None],
                     "raw": pa.array([b"\x00\x01", None]), "at": [when, None],
                     "day": [dt.date(2026, 1, 2), None], "price": [decimal.Decimal("12.34"), None],
                     "tags": [["x", "y"], []]}, schema=pa.schema(fields))
    with_error = rows.append_column("epoch", pa.array([2, 2], pa.int64())).append_column(
        "error", pa.array(["E: x", "E: y"]))
    target = sink(kafka, dead, query_id="q-orig")
    for region in ("a", "b"):  # letters in the topic in this order: a-7 at position 0, b-3 after it
        one = with_error.filter(pa.compute.equal(with_error["region"], region))
        target.commit(2 if region == "a" else 3, {region: target.prepare(2, region, iter(one.to_batches()))})
    first = replay_of(kafka, dead, tmp_path / "ck-1")
    assert first.schema == rows.schema and first.available(0) == {"a": 8, "b": 4}
    want = rows.to_pylist()
    [got_a] = replayed_rows(first, 0, "a", 0, 8)
    assert math.isnan(got_a.pop("score")) and math.isnan(want[0].pop("score"))  # NaN, -inf: back as they were
    assert got_a == want[0] and replayed_rows(first, 0, "b", 0, 4) == [want[1]]

    # The first replay recorded region b only: the mark stays at a's letter, naming b's beyond it.
    group = f"regional-replayed-{dead}"
    first.on_recorded(recorded(0, {"b": 4}))
    at = {m["headers"]["regional.region"]: m["position"] for m in letters_in(kafka, dead)}  # markers between
    [(offset, meta)] = group_marks(kafka, dead, group)
    assert (offset, meta["above"], meta["epoch"]) == (at["a"], [[at["b"], at["b"]]], 0)  # spans of letters
    assert meta["replayed_by"] == first._query_id()
    second = replay_of(kafka, dead, tmp_path / "ck-2")  # a new replay takes only what no replay took
    assert second.available(0) == {"a": 8}

    # The first replay records a as well: nothing is left for a new one. A letter of a later record is new; one
    # below where the first replay is (a late dead letter) fails it, naming it.
    assert first.available(1) == {"a": 8}
    first.before_splits(1)
    first.on_recorded(recorded(1, {"a": 8, "b": 4}))
    assert group_marks(kafka, dead, group)[0][0] > at["b"]
    assert replay_of(kafka, dead, tmp_path / "ck-3").available(0) == {}
    for epoch, offset in ((20, 9), (21, 5)):
        late = with_error.filter(pa.compute.equal(with_error["region"], "a")).set_column(
            1, "offset", pa.array([offset], pa.int64()))
        target.commit(epoch, {"a": target.prepare(epoch, "a", iter(late.to_batches()))})
    first.on_recorded(recorded(1, {"a": 8, "b": 4}))  # heard again (a restart): the late letter is not marked
    with pytest.raises(RegionalStoreError, match=r"after this replay had passed their offsets \(e.g. region 'a' at "
                                                 r"offset 5, below its committed offset 8\)"):
        first.available(2)
    fourth = replay_of(kafka, dead, tmp_path / "ck-4")
    assert fourth.available(0) == {"a": 10}
    assert [r["offset"] for r in replayed_rows(fourth, 0, "a", 0, 10)] == [5, 9]

    # python -m regional dead-letters kafka:<topic>: the letters, and which the group's marks say were replayed.
    import subprocess
    import sys

    shown = subprocess.run([sys.executable, "-m", "regional", "dead-letters", f"kafka:{dead}", "--json",
                            "--bootstrap-servers", kafka.bootstrap], capture_output=True, text=True, check=True)
    summary = json.loads(shown.stdout)
    assert (summary["records"], summary["waiting"], summary["by_error_class"]) == (4, 2, {"E": 4})
    assert summary["by_region"]["a"] == {"records": 3, "waiting": 2, "oldest": {"epoch": 2, "offset": 5},
                                         "newest": {"epoch": 2, "offset": 9}}  # the letters' own epoch column
    assert summary["table"] == f"kafka:{dead}" and summary["newest"]["error"] == "E: x"


def landed_once(out, want: dict[str, list[tuple[int, str]]]) -> None:
    """Each record once, with its value (a replayed record lands after its region's later records: not in order)."""
    from regional.testing.exactly_once import check, delta_landed

    report = check(want, delta_landed(out))
    assert not (report.lost or report.duplicated or report.wrong), report.explain()


def replay_topic(spark, dead: str, brokers: str, ck):
    return (spark.readStream.format("regional").option("source", "deadLetters").option("topic", dead)
            .option("kafka.bootstrap.servers", brokers).option("checkpointLocation", str(ck)).load())


def run_replay(df, out, ck, dead: str, brokers: str, parse) -> None:
    query = (df.select("region", "offset", parse(F.col("value").cast("string")).alias("value")).writeStream
             .format("regional").option("target", "delta").option("path", str(out))
             .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
             .option("deadLetterTopic", dead).option("deadLetter.kafka.bootstrap.servers", brokers)
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(300), "the replay did not end"
        assert query.exception() is None, query.exception()
    finally:
        query.stop()


@pytest.mark.campaign  # 159 s idle, keeping CI within its time
def test_kafka_to_a_dead_letter_topic_then_replays_of_it_land_every_record_exactly_once(spark, kafka, tmp_path):
    """Kafka -> Delta with deadLetterTopic: each poison record in the topic once, with its headers, the rest in the
    target once, the producer's credential nowhere in the checkpoint or progress. Then the UDF fixed but for one
    record, the replay of the topic runs the same select into the same target with Trigger.AvailableNow, its own
    dead letters to its own topic; a second replay (a new checkpoint) adds nothing; the replay of the replay's
    topic, fixed, completes the target: every record exactly once, wherever it came from. A replay whose dead
    letters would go to its own input is refused."""
    from integration.test_kafka_source import failure_of

    topic, dead, dead_again, dead_last = new_topic(kafka, 3), dead_topic(), dead_topic(), dead_topic()
    produce(kafka, topic, 3, 24, "m")
    out, ck = tmp_path / "out", tmp_path / "ck"
    poison = {(f"{topic}-1", 17): "m-1-17", (f"{topic}-2", 3): "m-2-3", (f"{topic}-2", 20): "m-2-20"}
    secret = f"pw-{os.getpid()}-s3cr3t"  # a credential among the producer's settings (ignored by PLAINTEXT)
    query = start_with_topic(kafka_stream(spark, kafka, ck, topic), out, ck, dead, kafka.bootstrap,
                             poison_udf(set(poison.values())), **{"deadLetter.kafka.sasl.password": secret})
    try:
        query.processAllAvailable()
        progress = json.dumps([p.json for p in query.recentProgress])
    finally:
        query.stop()
    # Never in Spark's offset log (the plan), the regional store, or the query's progress.
    assert not [p for p in ck.rglob("*") if p.is_file() and secret in p.read_text(errors="replace")]
    assert secret not in progress and dead in (ck / "offsets" / "1").read_text()
    everything = {r: [(o, v.upper()) for o, v in records] for r, records in expected(kafka, topic).items()}
    assert_exactly_once(out, {r: [(o, v) for o, v in rows if (r, o) not in poison] for r, rows in everything.items()})
    check_letters(kafka, dead, topic, poison, Store(ck).query_id())
    for region, _ in poison:
        assert regional.status(ck).regions[region].committed_offset == 24

    still = {(f"{topic}-2", 3): "m-2-3"}
    run_replay(replay_topic(spark, dead, kafka.bootstrap, tmp_path / "ck-r"), out, tmp_path / "ck-r", dead_again,
               kafka.bootstrap, poison_udf(set(still.values())))
    landed_once(out, {r: [(o, v) for o, v in rows if (r, o) not in still] for r, rows in everything.items()})
    check_letters(kafka, dead_again, topic, still, Store(tmp_path / "ck-r").query_id())

    version = len(list((out / "_delta_log").glob("*.json")))
    run_replay(replay_topic(spark, dead, kafka.bootstrap, tmp_path / "ck-2"), out, tmp_path / "ck-2", dead_last,
               kafka.bootstrap, poison_udf(set()))
    assert len(list((out / "_delta_log").glob("*.json"))) == version  # nothing to write: nothing was new

    run_replay(replay_topic(spark, dead_again, kafka.bootstrap, tmp_path / "ck-3"), out, tmp_path / "ck-3",
               dead_last, kafka.bootstrap, poison_udf(set()))
    landed_once(out, everything)
    assert sorted(tuple(r) for r in spark.read.format("delta").load(str(out)).select("region", "offset", "value")
                  .collect()) == sorted((r, o, v) for r, rows in everything.items() for o, v in rows)
    assert letters_in(kafka, dead_last) == []

    df = replay_topic(spark, dead, kafka.bootstrap, tmp_path / "ck-own")
    own = (df.select("region", "offset", F.col("value").cast("string").alias("value")).writeStream
           .format("regional").option("target", "delta").option("path", str(tmp_path / "own"))
           .option("checkpointLocation", str(tmp_path / "ck-own")).option("deadLetterTopic", dead)
           .option("deadLetter.kafka.bootstrap.servers", kafka.bootstrap).start())
    assert f"the dead letters' place kafka:{dead} is this query's own input" in failure_of(own)


@pytest.mark.campaign  # 40 s: the campaign command runs it (REGIONAL_CAMPAIGN=1), keeping CI within 30 minutes
def test_sigkill_of_a_topic_replay_before_its_marks_then_restart_lands_each_letter_once(kafka, tmp_path):
    """The topic replay's driver killed (SIGKILL) after an epoch's record, before the replay group's marks (in the
    sink's phase two); restarted: every letter lands once, the group's mark is past every letter, and a new replay
    (a new checkpoint) finds nothing to take."""
    from integration.helpers import run_killable

    dead, out, ck, marker = dead_topic(), tmp_path / "out", tmp_path / "ck", tmp_path / "reached"
    records = {r: [(o, f"{r}-{o}") for o in (2, 5, 11, 12, 30)] for r in ("a", "b", "c")}
    target = sink(kafka, dead, query_id="original")
    for epoch, (offset, region, value) in enumerate(sorted((o, r, v) for r, rows in records.items() for o, v in rows)):
        rows = pa.table({"region": [region], "offset": pa.array([offset], pa.int64()), "value": [value],
                         "epoch": pa.array([epoch], pa.int64()), "error": pa.array(["ValueError: bad"])})
        target.commit(epoch, {region: target.prepare(epoch, region, iter(rows.to_batches()))})
    args = ["integration.replay_child", f"kafka:{dead}@{kafka.bootstrap}", str(out), str(ck), str(tmp_path / "dlq")]
    assert run_killable(args, "before_marks:2", marker, timeout=600) == "killed"
    [(mark, _)] = group_marks(kafka, dead, f"regional-replayed-{dead}")
    assert run_killable(args, None, marker, timeout=600) == "finished"
    landed_once(out, {r: [(o, v.upper()) for o, v in rows] for r, rows in records.items()})
    [(after, meta)] = group_marks(kafka, dead, f"regional-replayed-{dead}")
    assert after > mark and meta["above"] == [] and meta["replayed_by"] == Store(ck).query_id()
    assert after > max(m["position"] for m in letters_in(kafka, dead))
    _forget_group(kafka, f"regional-replayed-{dead}")  # the group's offsets expire: the marks topic keeps them
    assert replay_of(kafka, dead, tmp_path / "ck-new").available(0) == {}


def test_a_topic_replay_neither_loses_nor_doubles_across_restarts_retention_two_queries_and_other_replays(kafka,
                                                                                                          tmp_path):
    """Found by a cold review, each failing before its fix. (1) A late letter arriving after an epoch's plan was
    logged and before its restarted re-run was taken into that epoch's ends and marked replayed, never read: the
    ends are now kept when the plan is made. (2) A replay run again after a newer replay took letters took them
    again: the group's marks are read at each plan. (3) Letters deleted by retention before any replay took them
    went unnoticed by a restarted replay, and its marks passed them. (4) Two different letters of one region and
    offset (two queries on one topic): the second was dropped."""
    from regional.errors import RegionalDataLossError, RegionalStoreError

    def letter(target, epoch: int, region: str, offset: int, value: str | None = None) -> None:
        rows = pa.table({"region": [region], "offset": pa.array([offset], pa.int64()),
                         "value": [value or f"{region}-{offset}"], "epoch": pa.array([epoch], pa.int64()),
                         "error": pa.array(["ValueError: bad"])})
        target.commit(epoch, {region: target.prepare(epoch, region, iter(rows.to_batches()))})

    # (1) The driver dies after epoch 1's plan is logged; r@0 arrives; the restart re-runs epoch 1 from its plan.
    dead = dead_topic()
    target = sink(kafka, dead)
    letter(target, 1, "r", 1)
    letter(target, 2, "r", 7)
    first = replay_of(kafka, dead, tmp_path / "ck-1")
    assert first.available(0) == {"r": 8} and [x["offset"] for x in replayed_rows(first, 0, "r", 0, 2)] == [1]
    first.on_recorded(recorded(0, {"r": 2}))
    assert first.available(1) == {"r": 8}  # epoch 1's plan: r [2, 8)
    letter(target, 3, "r", 0)
    again = replay_of(kafka, dead, tmp_path / "ck-1")
    again.on_recorded(recorded(0, {"r": 2}))
    assert [x["offset"] for x in replayed_rows(again, 1, "r", 2, 8)] == [7]
    again.on_recorded(recorded(1, {"r": 8}))
    with pytest.raises(RegionalStoreError, match="region 'r' at offset 0, below its committed offset 8"):
        again.available(2)
    assert replay_of(kafka, dead, tmp_path / "ck-1b").available(0) == {"r": 1}  # unmarked: a new replay takes it

    # (2) Replay A took a-1; B (a new checkpoint) took b-1; A run again takes nothing.
    dead = dead_topic()
    target = sink(kafka, dead)
    letter(target, 1, "a", 1)
    a = replay_of(kafka, dead, tmp_path / "ck-a")
    assert a.available(0) == {"a": 2} and len(replayed_rows(a, 0, "a", 0, 2)) == 1
    a.on_recorded(recorded(0, {"a": 2}))
    letter(target, 2, "b", 1)
    b = replay_of(kafka, dead, tmp_path / "ck-b")
    assert b.available(0) == {"b": 2} and len(replayed_rows(b, 0, "b", 0, 2)) == 1
    b.on_recorded(recorded(0, {"b": 2}))
    a = replay_of(kafka, dead, tmp_path / "ck-a")
    a.on_recorded(recorded(0, {"a": 2}))  # the restart hears its newest record first: B's marks are kept
    assert a.available(1) == {}
    assert replay_of(kafka, dead, tmp_path / "ck-c").available(0) == {}

    # (3) A replay took c-1 only; retention deletes a-1 and b-1; the replay restarted fails, naming them.
    dead = dead_topic()
    target = sink(kafka, dead)
    for epoch, region in enumerate("abc", start=1):
        letter(target, epoch, region, 1)
    at = {m["headers"]["regional.region"]: m["position"] for m in letters_in(kafka, dead)}
    c = replay_of(kafka, dead, tmp_path / "ck-r")
    assert c.available(0) == {"a": 2, "b": 2, "c": 2} and len(replayed_rows(c, 0, "c", 0, 2)) == 1
    c.on_recorded(recorded(0, {"c": 2}))
    _delete_records(kafka, dead, at["b"] + 1)
    restarted = replay_of(kafka, dead, tmp_path / "ck-r")
    restarted.on_recorded(recorded(0, {"c": 2}))  # heard first at the restart: the mark stays before a-1
    assert group_marks(kafka, dead, f"regional-replayed-{dead}")[0][0] <= at["a"]
    gone = rf"positions {at['a']} to {at['b']} of {re.escape(dead)} partition 0 held "
    with pytest.raises(RegionalDataLossError, match=gone + "region 'a' offset 1, not yet replayed, and the topic's "
                                                           "retention deleted them: they were never replayed"):
        restarted.available(1)
    with pytest.raises(RegionalDataLossError, match=gone + ".* they were never replayed"):  # a new replay
        replay_of(kafka, dead, tmp_path / "ck-r2").available(0)
    assert replay_of(kafka, dead, tmp_path / "ck-r3", failOnDataLoss="false").available(0) == {}  # c-1 was taken

    # (4) Two queries' different letters of one record fail the replay; the same letter twice is read once.
    dead = dead_topic()
    letter(sink(kafka, dead, query_id="q-1"), 1, "r", 3, "from query 1")
    letter(sink(kafka, dead, query_id="q-1b"), 1, "r", 3, "from query 1")
    twice = replay_of(kafka, dead, tmp_path / "ck-twice")
    assert twice.available(0) == {"r": 4} and len(replayed_rows(twice, 0, "r", 0, 4)) == 1
    letter(sink(kafka, dead, query_id="q-2"), 1, "r", 3, "from query 2")
    with pytest.raises(RegionalStoreError, match=r"two different letters .* are region 'r' offset 3"):
        replay_of(kafka, dead, tmp_path / "ck-shared").available(0)


def _delete_records(broker, topic: str, before: int) -> None:
    """Kafka's DeleteRecords, as retention does it: partition 0's log then starts at ``before``."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept: a client collected never answers
    for future in admin.delete_records([TopicPartition(topic, 0, before)], request_timeout=20).values():
        future.result(40)


def test_a_topic_replay_after_the_second_review_retention_availablenow_restarts_probes_and_long_marks(kafka,
                                                                                                      tmp_path):
    """Found by a second cold review, each failing on the code before its fix. (1) Retention deleting letters the
    replay already replayed made every later plan fail ("deleted before any replay took them") and left the marks
    unmade, so a new replay replayed the rest again. (2) Trigger.AvailableNow's start (the reader's
    prepareForTriggerAvailableNow) planned the epoch of a logged plan Spark had yet to re-run, before the source
    heard of its last record: a late letter was then kept in that epoch's ends and marked, never read. (3) A
    probe below the committed offset read the replay's own dead-lettered-again letter and another replay's.
    (4) Merged marks too long for the group's metadata dropped another replay's letters, which were replayed
    again: they are spans now, and kept in the store."""
    from regional.errors import RegionalStoreError
    from regional.spark.reader import RegionalStreamReader
    from regional.store.model import DeadLetter, EpochKind, EpochRecord, RegionState, Slice

    # (1) Epoch 0 replays r@1 and r@5; retention deletes them: the replay goes on, and a new replay takes only r@9.
    dead = dead_topic()
    target = sink(kafka, dead)
    for epoch, offset in enumerate((1, 5, 9), start=1):
        commit_letters(target, epoch, "r", [offset])
    at = {int(m["headers"]["regional.offset"]): m["position"] for m in letters_in(kafka, dead)}
    one = replay_of(kafka, dead, tmp_path / "ck-1")
    assert one.available(0) == {"r": 10} and [x["offset"] for x in replayed_rows(one, 0, "r", 0, 6)] == [1, 5]
    _delete_records(kafka, dead, at[5] + 1)
    replay_of(kafka, dead, tmp_path / "ck-1").on_recorded(recorded(0, {"r": 6}))  # the sink's phase two
    one.on_recorded(recorded(0, {"r": 6}))
    assert one.available(1) == {"r": 10}
    fresh = replay_of(kafka, dead, tmp_path / "ck-1n")
    assert fresh.available(0) == {"r": 10} and [x["offset"] for x in replayed_rows(fresh, 0, "r", 0, 10)] == [9]

    # (2) Epoch 1's plan (r [2, 8)) is logged; the driver dies; late r@0 arrives; the AvailableNow restart.
    dead = dead_topic()
    target = sink(kafka, dead)
    commit_letters(target, 1, "r", [1])
    commit_letters(target, 2, "r", [7])
    ck = tmp_path / "ck-2"
    two = replay_of(kafka, dead, ck)
    assert two.available(0) == {"r": 8} and len(replayed_rows(two, 0, "r", 0, 2)) == 1
    record = recorded(0, {"r": 2})
    two._store.write_record(record)
    two.on_recorded(record)
    assert two.available(1) == {"r": 8}
    (ck / "offsets").mkdir(parents=True)
    for epoch in (0, 1):  # what Spark logged
        (ck / "offsets" / str(epoch)).write_text("v1\n{}\n{}\n")
    commit_letters(target, 3, "r", [0])
    reader = RegionalStreamReader({}, {"source": "deadLetters", "topic": dead, "kafka.bootstrap.servers":
                                       kafka.bootstrap, "checkpointlocation": str(ck)})
    try:
        with pytest.raises(RegionalStoreError, match="region 'r' at offset 0, below its committed offset 2"):
            reader.prepareForTriggerAvailableNow()
    finally:
        reader.store.release_fence()
    late = next(m["position"] for m in letters_in(kafka, dead) if m["headers"]["regional.offset"] == "0")
    assert int(replay_of(kafka, dead, ck)._kept()["versions"]["1"]["ends"]["0"]) <= late  # epoch 1's, as planned

    # (3) A's r@1 fails again (dead-lettered); B takes r@5; A's probe of r below offset 12 reads neither.
    dead = dead_topic()
    target = sink(kafka, dead)
    for epoch, offset in enumerate((1, 5, 9, 12), start=1):
        commit_letters(target, epoch, "r", [offset])
    a = replay_of(kafka, dead, tmp_path / "ck-a")
    assert a.available(0) == {"r": 13}
    a.before_splits(0)
    a.on_recorded(EpochRecord(0, EpochKind.GLOBAL, {}, {}, {"r": RegionState(2, 0)},
                              dead_lettered={"r": DeadLetter(1, "ValueError: bad")}))
    b = replay_of(kafka, dead, tmp_path / "ck-b")
    assert b.available(0) == {"r": 13}  # r@1 is A's: dead-lettered again
    assert [x["offset"] for x in replayed_rows(b, 0, "r", 0, 6)] == [5]
    b.on_recorded(recorded(0, {"r": 6}))
    assert a.available(1) == {"r": 13}
    assert [x["offset"] for x in replayed_rows(a, 1, "r", 0, 12)] == [9]  # a probe before r@12

    # (4) z@0 waits; B takes c's 300 letters; A takes d's 400: the marks keep B's as a span, A never reads c again.
    dead = dead_topic()
    target = sink(kafka, dead)
    commit_letters(target, 1, "z", [0])
    commit_letters(target, 2, "c", list(range(300)))
    a = replay_of(kafka, dead, tmp_path / "ck-4a")
    b = replay_of(kafka, dead, tmp_path / "ck-4b")
    assert a.available(0) == {"z": 1, "c": 300} and b.available(0) == {"z": 1, "c": 300}
    b.before_splits(0)
    b.on_recorded(EpochRecord(0, EpochKind.GLOBAL, {"c": Slice(0, 300, 300)}, {}, {"c": RegionState(300, 0)}))
    commit_letters(target, 3, "d", list(range(400)))
    assert a.available(1) == {"z": 1, "d": 400}
    a.before_splits(1)
    a.on_recorded(EpochRecord(1, EpochKind.GLOBAL, {"d": Slice(0, 400, 400)}, {}, {"d": RegionState(400, 1)}))
    [(mark, meta)] = group_marks(kafka, dead, f"regional-replayed-{dead}")
    assert mark == 0 and len(meta["above"]) == 1  # one span: c's and d's letters, one after another
    assert a.available(2) == {"z": 1}
    assert replay_of(kafka, dead, tmp_path / "ck-4c").available(0) == {"z": 1}



def _forget_group(broker, group: str) -> None:
    """The group's committed offsets deleted, as the brokers do ``offsets.retention.minutes`` after it went empty
    (or ``kafka-consumer-groups --delete``)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept: a client collected never answers
    for future in admin.delete_consumer_groups([group], request_timeout=20).values():
        future.result(40)


def test_a_topic_replays_marks_outlive_its_groups_offsets_and_a_groups_older_marks_are_carried_over(kafka, tmp_path):
    """Issue 45. (1) A replay, then its group's committed offsets deleted (the brokers delete them 7 days after the
    group goes empty): a second replay took every letter again, doubling them in the target. The marks are kept in
    a compacted topic now: the second replay takes nothing, and a later letter only. (2) Marks that a regional
    before the marks topic kept in the group alone are honoured, and carried over into the topic when first read:
    they outlive the group too. (3) A marks topic whose cleanup.policy deletes records is refused. Each failed on
    the code before (the group was all there was)."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

    from regional.errors import RegionalConfigError

    # (1) The first replay takes r@1 and r@5 and marks them; the group's offsets go; a new replay takes nothing.
    dead = dead_topic()
    group = f"regional-replayed-{dead}"
    target = sink(kafka, dead)
    commit_letters(target, 1, "r", [1])
    commit_letters(target, 2, "r", [5])
    first = replay_of(kafka, dead, tmp_path / "ck-1")
    assert first.available(0) == {"r": 6}
    assert [x["offset"] for x in replayed_rows(first, 0, "r", 0, 6)] == [1, 5]
    first.on_recorded(recorded(0, {"r": 6}))
    [(mark, meta)] = group_marks(kafka, dead, group)  # the group shows them, as Kafka's tools read it
    assert mark > max(m["position"] for m in letters_in(kafka, dead)) and meta["replayed_by"] == first._query_id()
    _forget_group(kafka, group)
    assert group_marks(kafka, dead, group)[0][0] < 0  # no committed offset any more
    assert replay_of(kafka, dead, tmp_path / "ck-2").available(0) == {}
    commit_letters(target, 3, "r", [9])
    later = replay_of(kafka, dead, tmp_path / "ck-3")
    assert later.available(0) == {"r": 10} and [x["offset"] for x in replayed_rows(later, 0, "r", 0, 10)] == [9]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, group)  # the marks topic is named after the group by default
    assert admin.describe_configs([resource])[resource].result(30)["cleanup.policy"].value == "compact"

    # (2) Marks in the group alone, as a regional before the marks topic committed them: r@1 and r@5 replayed.
    dead = dead_topic()
    group = f"regional-replayed-{dead}"
    target = sink(kafka, dead)
    for epoch, offset in enumerate((1, 5, 9), start=1):
        commit_letters(target, epoch, "r", [offset])
    at = {int(m["headers"]["regional.offset"]): m["position"] for m in letters_in(kafka, dead)}
    old = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        old.commit(offsets=[TopicPartition(dead, 0, at[9], metadata=json.dumps(
            {"replayed_by": "an-older-replay", "epoch": 4, "above": []}))], asynchronous=False)
    finally:
        old.close()
    new = replay_of(kafka, dead, tmp_path / "ck-m")
    assert new.available(0) == {"r": 10} and [x["offset"] for x in replayed_rows(new, 0, "r", 0, 10)] == [9]
    _forget_group(kafka, group)
    assert replay_of(kafka, dead, tmp_path / "ck-m2").available(0) == {"r": 10}  # carried over: only r@9 waits
    new.on_recorded(recorded(0, {"r": 10}))
    _forget_group(kafka, group)
    assert replay_of(kafka, dead, tmp_path / "ck-m3").available(0) == {}

    # (3) A marks topic that retention would empty is refused, before anything is read.
    dead = dead_topic()
    commit_letters(sink(kafka, dead), 1, "r", [1])
    marks = f"marks-{dead}"
    admin.create_topics([NewTopic(marks, 1, 1, config={"cleanup.policy": "delete"})])[marks].result(30)
    with pytest.raises(RegionalConfigError, match=f"the replay marks topic {re.escape(marks)} has "
                                                  "cleanup.policy=delete: retention would delete its records"):
        replay_of(kafka, dead, tmp_path / "ck-d", replayMarksTopic=marks).available(0)


@pytest.mark.campaign  # 99 s idle, keeping CI within its time
def test_a_second_topic_replay_after_the_groups_offsets_expired_lands_nothing_twice(kafka, tmp_path):
    """Issue 45, end to end (real Spark, Trigger.AvailableNow, phase two marking): a replay lands every letter once;
    its group's committed offsets are deleted (as the brokers do 7 days after the group goes empty); a second
    replay (a new checkpoint, the same target) lands nothing. On the code before, the second replay found no
    marks and landed every letter again."""
    from regional.testing.exactly_once import delta_landed

    dead, out, marker = dead_topic(), tmp_path / "out", tmp_path / "reached"
    records = {r: [(o, f"{r}-{o}") for o in (2, 5, 11)] for r in ("a", "b")}
    target = sink(kafka, dead, query_id="original")
    for epoch, (offset, region, value) in enumerate(sorted((o, r, v) for r, rows in records.items() for o, v in rows)):
        rows = pa.table({"region": [region], "offset": pa.array([offset], pa.int64()), "value": [value],
                         "epoch": pa.array([epoch], pa.int64()), "error": pa.array(["ValueError: bad"])})
        target.commit(epoch, {region: target.prepare(epoch, region, iter(rows.to_batches()))})
    want = {r: [(o, v.upper()) for o, v in rows] for r, rows in records.items()}
    for run, ck in enumerate((tmp_path / "ck-1", tmp_path / "ck-2")):
        args = ["integration.replay_child", f"kafka:{dead}@{kafka.bootstrap}", str(out), str(ck),
                str(tmp_path / f"dlq-{run}")]
        assert run_killable(args, None, marker, timeout=600) == "finished"
        landed_once(out, want)
        _forget_group(kafka, f"regional-replayed-{dead}")
    assert len(delta_landed(out)) == 6


def test_two_writers_of_the_marks_at_once_never_overwrite_each_others(kafka):
    """The marks are written read-modify-write: a writer fenced by another between its read and its commit starts
    again and reads the other's marks, so neither is lost (with the group alone, the later commit won). Made
    deterministic: the second writer writes inside the first's computation."""
    from regional.inputs.deadletter_topic.marks import Mark, MarksStore

    dead = new_topic(kafka, 2)  # the dead-letter topic (its letters do not matter here)
    conf = {"bootstrap.servers": kafka.bootstrap}
    first, second = (MarksStore(dead, f"regional-replayed-{dead}", f"marks-{dead}", conf, 30) for _ in range(2))
    seen: list[dict[int, Mark]] = []

    def compute(current: dict[int, Mark]) -> list[Mark]:
        seen.append(current)
        if len(seen) == 1:  # another replay marks partition 1 between this one's read and its commit
            second.write(lambda _: [Mark(1, 7, {"replayed_by": "b", "epoch": 0, "above": []})])
        return [Mark(0, 4, {"replayed_by": "a", "epoch": 0, "above": [[6, 6]]})]

    first.write(compute)
    assert len(seen) == 2 and 1 not in seen[0] and seen[1][1].offset == 7  # fenced, read again: b's marks seen
    fresh = MarksStore(dead, f"regional-replayed-{dead}", f"marks-{dead}", conf, 30).read([0, 1], carry=False)
    assert {p: (m.offset, m.meta["replayed_by"]) for p, m in fresh.items()} == {0: (4, "a"), 1: (7, "b")}
    assert [(p, o) for p, (o, _) in enumerate(group_marks_of(kafka, dead, f"regional-replayed-{dead}", 2))] == \
        [(0, 4), (1, 7)]  # the group shows both, each written in its mark's transaction


def group_marks_of(broker, topic: str, group: str, partitions: int) -> list[tuple[int, dict[str, Any]]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return [(tp.offset, json.loads(tp.metadata or "{}")) for tp in sorted(found, key=lambda tp: tp.partition)]
    finally:
        consumer.close()
