"""Dead letters to a Kafka topic (``deadLetterTopic``) on a real broker: each poison record in the topic exactly once
(read ``read_committed``), with its key, value and headers, and everything else in the target exactly once, whatever
re-runs and SIGKILLs of the driver around the topic's transaction."""

from __future__ import annotations

import itertools
import json
import os
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

_names = itertools.count()


def dead_topic() -> str:
    return f"dead.{next(_names)}-{os.getpid()}-{time.monotonic_ns()}"


def letters_in(broker, topic: str, isolation: str = "read_committed") -> list[dict[str, Any]]:
    """Every record of ``topic`` (all partitions, to their end) with its key, value and headers; [] if no topic."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "regional-check-dead",
                         "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": True})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        out = []
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            done, deadline = False, time.monotonic() + 30
            while not done and time.monotonic() < deadline:
                for m in consumer.consume(500, timeout=0.5):
                    if m.error() is not None:
                        done = done or m.error().code() == KafkaError._PARTITION_EOF
                        continue
                    out.append({"key": m.key(), "value": m.value(), "partition": p,
                                "headers": {k: v if v is None else v.decode() for k, v in (m.headers() or [])},
                                "header_keys": [k for k, _ in (m.headers() or [])]})
            assert done, f"could not read {topic}-{p} to its end"
        return out
    finally:
        consumer.close()


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
    assert letters[0]["headers"] == {
        "regional.error.class": "ValueError", "regional.error.message": "cannot parse m-1-17",
        "regional.region": "src-1", "regional.offset": "17", "regional.epoch": "4", "regional.query.id": "q-test",
        "regional.source.topic": "src", "regional.source.partition": "1", "regional.source.offset": "17"}

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
    in a row is null in its JSON (strict parsers refuse the bare NaN token)."""
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
    assert json.loads(letter["value"]) == {"region": "a", "offset": 9, "score": None}
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


def test_poison_kafka_records_land_in_the_dead_letter_topic_once_and_the_rest_in_the_target(spark, kafka, tmp_path):
    topic, dead = new_topic(kafka, 3), dead_topic()
    produce(kafka, topic, 3, 40, "m")
    out, ck = tmp_path / "out", tmp_path / "ck"
    poison = {(f"{topic}-1", 17): "m-1-17", (f"{topic}-2", 3): "m-2-3"}
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
    want = {r: [(o, v.upper()) for o, v in records if (r, o) not in poison]
            for r, records in expected(kafka, topic).items()}
    assert_exactly_once(out, want)
    check_letters(kafka, dead, topic, poison, Store(ck).query_id())
    for region, _ in poison:
        assert regional.status(ck).regions[region].committed_offset == 40


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
    """A store, and epoch 0's plan and task outcomes: region a's record at offset 4 dead-lettered (dead letters to
    ``topic``), region b's slice written."""
    from regional.dead_letters import encode_records
    from regional.inputs.files import SCHEMA, batch_of
    from regional.protocol.decide import Outcome, TaskOutcome
    from regional.protocol.plan import RegionRange, plan_epoch
    from regional.protocol.settings import Settings

    store = Store(tmp_path / "ck")
    store.open_query()
    s = Settings(dead_letter_topic=topic, region_attempts=2)
    plan = plan_epoch(0, store.query_id(), str(store.checkpoint), {}, {"a": 5, "b": 8}, s)
    plan = type(plan)(plan.query_id, 0, plan.store, (RegionRange("a", 4, 5, None, True), plan.regions[1]), s)
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
    assert store.read_record(0) is None and target.commits == {}
    assert store.read_intent(0).dead_letter_topic == topic
    assert not any("s3cr3t" in p.read_text(errors="replace") for p in (tmp_path / "ck").rglob("*") if p.is_file())

    renamed = type(plan)(plan.query_id, 0, plan.store, plan.regions,
                         Settings(dead_letter_topic=dead_topic(), region_attempts=2))
    up = {"deadLetter.kafka.bootstrap.servers": kafka.bootstrap}
    for _ in range(2):  # the restart, and a second one (the record is there: nothing happens)
        record = commit_epoch(renamed, tasks, store, target,
                              dead_letter_sink=lambda p, q: dead_letter_target(p, q, up))
    assert record.dead_lettered["a"].offset == 4 and target.commits == {0: {"b": "b@0-8"}}
    [letter] = letters_in(kafka, topic)
    assert letter["value"] == b'{"region": "a", "offset": 4, "value": "a-4"}'
    assert letter["headers"]["regional.epoch"] == "0" and letter["headers"]["regional.error.class"] == "unknown"
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
