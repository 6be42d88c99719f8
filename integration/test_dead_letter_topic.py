"""Dead letters to a Kafka topic (``deadLetterTopic``) on a real broker: each poison record in the topic exactly once
(read ``read_committed``), with its key, value and headers, and everything else in the target exactly once, whatever
re-runs and SIGKILLs of the driver around the topic's transaction."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import pyarrow as pa
from pyspark.sql import functions as F

import regional
from integration.helpers import assert_exactly_once, poison_udf, run_killable
from integration.test_kafka_source import expected, kafka_stream, new_topic, produce
from regional.store import Store
from regional.targets import dead_letter_target
from regional.targets.kafka_topic import DeadLetterTopic

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
                                "headers": {k: v.decode() for k, v in (m.headers() or [])}})
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


def start_with_topic(df, out, ck, dead: str, brokers: str, parse):
    return (df.select("region", "offset", parse(F.col("value").cast("string")).alias("value")).writeStream
            .format("regional").option("target", "delta").option("path", str(out))
            .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
            .option("deadLetterTopic", dead).option("deadLetter.kafka.bootstrap.servers", brokers).start())


def test_poison_kafka_records_land_in_the_dead_letter_topic_once_and_the_rest_in_the_target(spark, kafka, tmp_path):
    topic, dead = new_topic(kafka, 3), dead_topic()
    produce(kafka, topic, 3, 40, "m")
    out, ck = tmp_path / "out", tmp_path / "ck"
    poison = {(f"{topic}-1", 17): "m-1-17", (f"{topic}-2", 3): "m-2-3"}
    query = start_with_topic(kafka_stream(spark, kafka, ck, topic), out, ck, dead, kafka.bootstrap,
                             poison_udf(set(poison.values())))
    try:
        query.processAllAvailable()
    finally:
        query.stop()
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
