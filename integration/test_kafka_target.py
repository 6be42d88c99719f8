"""target=kafka on the tests' real broker: Kafka in, Kafka out, each input record once for a read_committed
consumer; Spark's own Kafka sink as the reference (``integration.stock_kafka``, a child process: the shared session
has no Kafka connector); a record too large for its topic dead-lettered while the other region is published; two
committers of one epoch (a zombie driver's and its successor's); SIGKILLs inside phase two."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import functions as F

import regional
from integration.helpers import ROOT, delta_landed, run_killable
from regional.testing.kafka_broker import KafkaBroker, topic_messages

_topics = itertools.count()


def new_topic(kafka: KafkaBroker, partitions: int, config: dict[str, str] | None = None, name: str = "t") -> str:
    topic = f"kt{next(_topics)}.{name}-{os.getpid()}"
    kafka.create_topic(topic, partitions, config)
    return topic


def produce_input(kafka: KafkaBroker, topic: str, partitions: int, per_partition: int, tag: str,
                  big: dict[tuple[int, int], int] | None = None) -> dict[tuple[int, int], bytes]:
    """Keyed records with headers (every fifth a tombstone-like empty value): {(partition, offset): value}."""
    producer = kafka.producer()
    sent: dict[tuple[int, int], bytes] = {}
    for p in range(partitions):
        for i in range(per_partition):
            size = (big or {}).get((p, i))
            value = (b"x" * size) if size else f"{tag}-{p}-{i}".encode()
            headers = [("h", f"{p}:{i}".encode()), ("null", None)] if i % 3 == 0 else None
            producer.produce(topic, value=value, key=f"k{i % 7}".encode(), partition=p, headers=headers)
            sent[(p, i)] = value
    assert producer.flush(30) == 0
    return sent


def read_out(kafka: KafkaBroker, topic: str, isolation: str = "read_committed") -> list[dict[str, Any]]:
    """Every record of ``topic`` as a consumer with ``isolation`` sees it, partition by partition, in order."""
    return topic_messages(kafka.bootstrap, topic, isolation)


def kafka_in(spark, kafka: KafkaBroker, topic: str, ck: Path, **options: str):
    return (spark.readStream.format("regional").option("source", "kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap).option("subscribe", topic)
            .option("startingOffsets", "earliest").option("includeHeaders", "true")
            .option("checkpointLocation", str(ck)).options(**options).load())


def to_kafka(df, kafka: KafkaBroker, out_topic: str, ck: Path, **options: str):
    writer = (df.writeStream.format("regional").option("target", "kafka").option("topic", out_topic)
              .option("kafka.bootstrap.servers", kafka.bootstrap).option("checkpointLocation", str(ck))
              .trigger(availableNow=True))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def traced(df):
    """Each output value names its input record: ``<region>|<offset>|<value>``, so a consumer can count it."""
    return df.select("region", "offset", "key", "headers",
                     F.concat_ws("|", "region", F.col("offset").cast("string"),
                                 F.col("value").cast("string")).alias("value"))


def assert_each_input_once_in_order(out: list[dict[str, Any]], expected: dict[tuple[str, int], str]) -> None:
    got = [m["value"].decode().split("|", 2) for m in out]
    keys = [(r, int(o)) for r, o, _v in got]
    assert sorted(keys) == sorted(expected), "an input record is missing or doubled in the output"
    assert {(r, int(o)): v for r, o, v in got} == expected
    for p in {m["partition"] for m in out}:  # each region's records in its input order within an output partition
        seen: dict[str, int] = {}
        for m, (r, o, _v) in zip(out, got, strict=True):
            if m["partition"] == p:
                assert int(o) > seen.get(r, -1), f"region {r} out of order in partition {p}"
                seen[r] = int(o)


def test_kafka_to_kafka_each_record_once_in_order_keys_and_headers_kept(spark, kafka, tmp_path):
    src, out_topic = new_topic(kafka, 3, name="in"), new_topic(kafka, 4, name="out")
    sent = produce_input(kafka, src, 3, 30, "a")
    ck = tmp_path / "ck"
    to_kafka(traced(kafka_in(spark, kafka, src, ck, maxOffsetsPerTrigger="40")), kafka, out_topic,
             ck).awaitTermination(180)
    more = {(p, 30 + i): v for (p, i), v in produce_input(kafka, src, 3, 10, "b").items()}  # a second run
    to_kafka(traced(kafka_in(spark, kafka, src, ck)), kafka, out_topic, ck).awaitTermination(180)

    out = read_out(kafka, out_topic)
    expected = {(f"{src}-{p}", i): v.decode() for (p, i), v in sent.items()}
    expected |= {(f"{src}-{p}", i): v.decode() for (p, i), v in more.items()}
    assert_each_input_once_in_order(out, expected)
    by_value = {m["value"].decode(): m for m in out}
    for (p, i), value in sent.items():
        m = by_value[f"{src}-{p}|{i}|{value.decode()}"]
        assert m["key"] == f"k{i % 7}".encode()
        assert m["headers"] == ([("h", f"{p}:{i}".encode()), ("null", None)] if i % 3 == 0 else [])
    assert len(read_out(kafka, out_topic, "read_uncommitted")) == len(out)  # no aborted transaction on the way
    status = regional.status(ck)
    assert status.epochs and all(not e.fallen_back for e in status.epochs)


STOCK_EXPRS = ["key", "value", "headers", "CASE WHEN partition = 1 THEN 2 ELSE NULL END AS partition"]


def test_same_records_as_sparks_own_kafka_sink(spark, kafka, tmp_path):
    """The same rows (keys, values, null values, headers with null values, a partition column null for some rows)
    through Spark's Kafka sink and regional's: the same records in each output partition, compared one by one."""
    src = new_topic(kafka, 2, name="in")
    stock_out, ours = new_topic(kafka, 3, name="stock"), new_topic(kafka, 3, name="ours")
    producer = kafka.producer()
    for p in range(2):
        for i in range(25):
            value = None if i % 11 == 10 else f"v{p}-{i}".encode()
            headers = [("a", b"1"), ("b", None), ("a", b"2")] if i % 4 == 0 else None
            producer.produce(src, value=value, key=None if i % 5 == 4 else f"key-{i}".encode(), partition=p,
                             headers=headers)
    assert producer.flush(30) == 0

    spec = tmp_path / "spec.json"
    read = {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": src, "includeHeaders": "true",
            "startingOffsets": "earliest"}
    spec.write_text(json.dumps({"runs": [{"out": str(tmp_path / "stock"), "ck": "", "sink": {
        "read": read, "exprs": STOCK_EXPRS, "write": {"kafka.bootstrap.servers": kafka.bootstrap,
                                                      "topic": stock_out}}}]}))
    done = subprocess.run([sys.executable, "-m", "integration.stock_kafka", str(spec)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert (tmp_path / "stock.result").read_text() == "ok", done.stderr[-3000:]

    ck = tmp_path / "ck"
    df = kafka_in(spark, kafka, src, ck).selectExpr("region", "offset", *STOCK_EXPRS)
    to_kafka(df, kafka, ours, ck).awaitTermination(180)

    def records(topic: str) -> list[tuple[Any, ...]]:
        # Records with a null key and no partition go where each producer's partitioner puts them (Java's sticky
        # partitioner, librdkafka's random one): their partition is compared only when a row or a key decides it.
        return sorted((m["partition"] if m["key"] is not None or m["value"] is None else -1, m["key"] or b"",
                       m["value"] or b"", str(m["headers"])) for m in read_out(kafka, topic))

    stock, regional_records = records(stock_out), records(ours)
    assert len(stock) == 50
    assert regional_records == stock


def test_a_record_too_large_for_its_topic_is_dead_lettered_and_the_other_region_published(spark, kafka, tmp_path):
    """Region 0 holds one record over the output topic's max.message.bytes: Kafka would refuse it, so it is the
    record's own fault (RowsInvalid): it goes to the dead letters, and every other record of both regions is in the
    output once; region 1 is published in every epoch."""
    src = new_topic(kafka, 2, name="in")
    out_topic = new_topic(kafka, 2, {"max.message.bytes": "3000"}, name="small")
    sent = produce_input(kafka, src, 2, 12, "s", big={(0, 5): 5000})
    ck, dead = tmp_path / "ck", tmp_path / "dead"
    df = kafka_in(spark, kafka, src, ck, maxOffsetsPerTrigger="8").select("region", "offset", "key", "headers",
                                                                          "value")
    to_kafka(df, kafka, out_topic, ck, deadLetterPath=str(dead),
             deadLetterRetries="0").awaitTermination(300)

    out = read_out(kafka, out_topic)
    assert sorted(m["value"] for m in out) == sorted(v for (p, i), v in sent.items() if (p, i) != (0, 5))
    letters = delta_landed(dead)
    assert [(r.region, r.offset) for r in letters] == [(f"{src}-0", 5)]
    status = regional.status(ck)
    assert all(f"{src}-1" not in e.fallen_back for e in status.epochs)


def test_the_batch_size_rule_is_the_brokers(kafka):
    """The target's size check (``records.batch_bytes``) against the broker itself: a record whose one-record batch
    is exactly the topic's max.message.bytes is taken; one byte more is refused."""
    from regional.targets.kafka.records import batch_bytes

    limit = 2000
    topic = new_topic(kafka, 1, {"max.message.bytes": str(limit)}, name="edge")
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0, "enable.idempotence": True})
    headers = [{"key": "h", "value": b"12"}]
    results = []
    for extra in (0, 1):
        size = limit - batch_bytes(b"key", b"", headers) + extra
        value = b"v" * size
        while batch_bytes(b"key", value, headers) < limit + extra:  # a varint may grow by a byte
            value += b"v"
        while batch_bytes(b"key", value, headers) > limit + extra:
            value = value[:-1]
        assert batch_bytes(b"key", value, headers) == limit + extra
        producer.produce(topic, value=value, key=b"key", headers=[("h", b"12")],
                         on_delivery=lambda err, _m: results.append(err))
        producer.flush(30)
    assert results[0] is None
    assert results[1] is not None and "TOO_LARGE" in results[1].name()


def test_two_committers_of_one_epoch_produce_it_once(kafka, tmp_path, monkeypatch):
    """A zombie driver's target (A) has produced the epoch in its open transaction when its successor (B, the same
    query) commits the same epoch: B fences A, whose transaction is aborted and whose commit fails; the records are
    in the topic once, and A, run again, finds the marker and produces nothing."""
    import pyarrow as pa

    from regional import failpoints
    from regional.targets import load_target
    from regional.targets.kafka import KafkaTargetError

    topic = new_topic(kafka, 2, name="zombie")
    options = {"target": "kafka", "kafka.bootstrap.servers": kafka.bootstrap, "topic": topic,
               "checkpointlocation": str(tmp_path / "ck"), "queryid": "q-zombie"}
    a, b = load_target(options), load_target(options)
    rows = pa.RecordBatch.from_pydict({"key": [b"k1", b"k2"], "value": [b"one", b"two"]})
    a.open(rows.schema)
    handles = {"r-0": a.prepare(4, "r-0", iter([rows]))}
    interleaved: list[str] = []

    def b_commits_meanwhile(name: str, epoch: int) -> None:
        if not interleaved:
            interleaved.append(name)
            b.commit(epoch, handles)

    monkeypatch.setattr(failpoints, "reach", b_commits_meanwhile)
    with pytest.raises(KafkaTargetError, match=r"(?i)fenced"):
        a.commit(4, handles)
    monkeypatch.undo()
    assert interleaved == ["kafka_produced"]
    assert sorted(m["value"] for m in read_out(kafka, topic)) == [b"one", b"two"]
    a.commit(4, handles)  # A, restarted, finds the marker
    assert sorted(m["value"] for m in read_out(kafka, topic)) == [b"one", b"two"]


KILL_POINTS = ["kafka_produced", "kafka_committed"]


@pytest.mark.campaign  # two child drivers (61 s in the fresh clone's run): the zombie test guards the fencing in CI
@pytest.mark.parametrize("point", ["before_publish", *KILL_POINTS, "before_record"])
def test_sigkill_inside_phase_two_then_restart_each_record_once(kafka, tmp_path, point):
    """The driver is SIGKILLed at ``point`` of an epoch's phase two (before the transaction, with its records
    produced but not committed, after it committed and before the epoch is recorded...); a restart finishes the
    epoch from its intent: a read_committed consumer counts each input record once."""
    src, out_topic = new_topic(kafka, 2, name="in"), new_topic(kafka, 2, name="out")
    sent = produce_input(kafka, src, 2, 20, "k")
    ck, marker = tmp_path / "ck", tmp_path / "reached"
    args = ["integration.kafka_target_child", kafka.bootstrap, src, out_topic, str(ck)]
    assert run_killable(args, f"{point}:1", marker) == "killed"
    assert run_killable(args, None, marker) == "finished"
    expected = {(f"{src}-{p}", i): v.decode() for (p, i), v in sent.items()}
    assert_each_input_once_in_order(read_out(kafka, out_topic), expected)
