"""source=kafka on a real broker (KRaft, loopback), into real Delta tables, checked record by record
against a plain consumer's read of the topic."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import functions as F

import regional
from integration.helpers import assert_exactly_once, table_rows, wait_for_epochs
from regional.testing.kafka_broker import KafkaBroker, free_port

FLAKY = "python:integration.faults:FlakyDelta"
_topics = itertools.count()


def new_topic(broker: KafkaBroker, partitions: int) -> str:
    topic = f"t{next(_topics)}.orders-{os.getpid()}"  # dots and dashes, as real topic names have
    broker.create_topic(topic, partitions)
    return topic


def produce(broker: KafkaBroker, topic: str, partitions: int, per_partition: int, tag: str) -> None:
    producer = broker.producer()
    for i in range(per_partition):
        for p in range(partitions):
            producer.produce(topic, value=f"{tag}-{p}-{i}".encode(), key=f"k{i}".encode(), partition=p)
    assert producer.flush(30) == 0


def kafka_stream(spark, broker: KafkaBroker, ck: Path, topic: str | None, **options: str):
    reader = (spark.readStream.format("regional").option("source", "kafka")
              .option("kafka.bootstrap.servers", broker.bootstrap).option("checkpointLocation", str(ck))
              .option("startingOffsets", "earliest"))
    if topic is not None:
        reader = reader.option("subscribe", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def start(df, out: Path, ck: Path, target: str = "delta", trigger: dict | None = None, **options: str):
    writer = (df.select("region", "offset", F.col("value").cast("string").alias("value")).writeStream
              .format("regional").option("target", target).option("path", str(out))
              .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true"))
    for k, v in options.items():
        writer = writer.option(k, v)
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()


def expected(broker: KafkaBroker, topic: str, isolation: str = "read_committed") -> dict[str, list[tuple[int, str]]]:
    return {r: [(o, v.decode()) for o, v in records] for r, records in broker.records(topic, isolation).items()}


def counted_consumes(monkeypatch) -> list[int]:
    """How many records each ``consume()`` of the tasks' consumers asks for, from now on (the pool emptied: a
    pooled consumer of an earlier test would not count)."""
    import confluent_kafka

    from regional.inputs.kafka import CONSUMERS

    CONSUMERS.close()
    asked: list[int] = []

    class Counting(confluent_kafka.Consumer):
        def consume(self, num_messages: int = 1, timeout: float = -1):  # type: ignore[override]
            asked.append(num_messages)
            return super().consume(num_messages, timeout)

    monkeypatch.setattr(confluent_kafka, "Consumer", Counting)
    return asked


def failure_of(query, timeout: float = 120) -> str:
    """The query must fail, within ``timeout``: its error text."""
    try:
        query.awaitTermination(timeout)
    except Exception as exc:
        return str(exc)
    finally:
        query.stop()
    raise AssertionError(f"the query did not fail within {timeout}s")


@pytest.mark.smoke
def test_failing_target_region_falls_back_while_the_others_publish(spark, kafka, tmp_path):
    """Also holds the claim of the former test_available_now_ends_only_when_everything_is_published (issue 57:
    the same query shape): an AvailableNow query whose other regions are done goes on until the fallen-back one
    has published everything, and ends by itself."""
    topic = new_topic(kafka, 4)
    produce(kafka, topic, 4, 30, "a")
    out, ck = tmp_path / "out", tmp_path / "ck"
    sick = f"{topic}-2"
    query = start(kafka_stream(spark, kafka, ck, topic, maxRecordsPerRegion="10", commitOffsetsToGroup="dash"),
                  out, ck, target=FLAKY, failRegion=sick, failEpochs="1,2", trigger={"availableNow": True})
    try:
        assert query.awaitTermination(180), "the AvailableNow query did not end"
    finally:
        query.stop()
    assert query.exception() is None
    epochs = regional.status(ck).epochs
    assert [e.kind for e in epochs[:3]] == ["global", "regional", "regional"]
    for e in epochs[1:3]:
        assert sick not in e.committed and e.fallen_back[sick].ref_epoch == 0
        assert len(e.committed) == 3  # the healthy partitions publish in every epoch
    # the healthy ones were done in epoch 2: the run went on for the sick one, and ended on a whole epoch
    assert len(epochs) >= 5 and all(set(e.committed) <= {sick} for e in epochs[3:])
    assert epochs[-1].kind == "global" and epochs[-1].whole
    assert_exactly_once(out, expected(kafka, topic), spark)
    st = regional.status(ck)
    assert {r: s.committed_offset for r, s in st.regions.items()} == {f"{topic}-{p}": 30 for p in range(4)}
    # commitOffsetsToGroup: Kafka's own lag tools see regional's committed offsets
    group = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "dash"})
    try:
        committed = group.committed([TopicPartition(topic, p) for p in range(4)], timeout=10)
    finally:
        group.close()
    assert [tp.offset for tp in committed] == [30, 30, 30, 30]


def test_a_poison_message_quarantines_its_partition_only(spark, kafka, tmp_path):
    topic = new_topic(kafka, 3)
    produce(kafka, topic, 3, 12, "a")
    out, ck, marker = tmp_path / "out", tmp_path / "ck", tmp_path / "poison"
    marker.touch()
    poison, flag = "a-1-5", str(marker)

    @F.udf("string")
    def parse(value: bytes) -> str:
        text = value.decode()
        if text == poison and os.path.exists(flag):
            raise ValueError(f"cannot parse poisoned message {text}")
        return text

    df = kafka_stream(spark, kafka, ck, topic, maxRecordsPerRegion="4")
    query = start(df.select("region", "offset", parse("value").alias("value")), out, ck)
    try:
        wait_for_epochs(query, ck, 4)
        st = regional.status(ck)
        assert st.regions[f"{topic}-1"].state == "quarantined" and st.regions[f"{topic}-1"].committed_offset == 4
        assert st.regions[f"{topic}-0"].committed_offset == 12 and st.regions[f"{topic}-2"].committed_offset == 12
        marker.unlink()  # the fix is deployed
        query.processAllAvailable()
    finally:
        query.stop()
    quarantined = [e for e in regional.status(ck).epochs if f"{topic}-1" in e.fallen_back]
    assert quarantined and all("cannot parse poisoned message a-1-5" in e.fallen_back[f"{topic}-1"].reason
                               for e in quarantined)
    assert_exactly_once(out, expected(kafka, topic), spark)


def test_transactional_producer_offset_gaps_read_committed(spark, kafka, tmp_path):
    topic = new_topic(kafka, 2)
    producer = kafka.producer(**{"transactional.id": f"tx-{topic}"})
    producer.init_transactions(60)
    for batch, commit in (("c1", True), ("ab", False), ("c2", True), ("c3", True)):
        producer.begin_transaction()
        for i in range(7):
            for p in range(2):
                producer.produce(topic, value=f"{batch}-{p}-{i}".encode(), partition=p)
        # Wait for delivery first: librdkafka can send an abort's EndTxn before the coordinator has
        # registered the partitions, which fails fatally with INVALID_TXN_STATE (librdkafka#4849).
        assert producer.flush(60) == 0, "the transaction's records were not delivered"
        (producer.commit_transaction if commit else producer.abort_transaction)(60)
    produce(kafka, topic, 2, 3, "plain")
    out, ck = tmp_path / "out", tmp_path / "ck"
    df = kafka_stream(spark, kafka, ck, topic, maxRecordsPerRegion="5", **{"kafka.isolation.level": "read_committed"})
    query = start(df, out, ck, trigger={"availableNow": True})
    assert query.awaitTermination(180), "the AvailableNow query did not end"  # no wait on a marker offset
    want = expected(kafka, topic)
    offsets = [o for o, _ in want[f"{topic}-0"]]
    assert len(offsets) == 7 * 3 + 3 and offsets != list(range(len(offsets)))  # gaps: markers, aborted records
    assert not any(v.startswith("ab-") for recs in want.values() for _, v in recs)
    assert_exactly_once(out, want, spark)
    st = regional.status(ck)  # each region's committed offset is its partition's end, past the last marker
    watermarks = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "w"})
    try:
        for p in range(2):
            _, high = watermarks.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assert st.regions[f"{topic}-{p}"].committed_offset == high
    finally:
        watermarks.close()


def test_new_partitions_join_and_a_broker_restart_loses_nothing(spark, kafka, tmp_path):
    topic = new_topic(kafka, 2)
    produce(kafka, topic, 2, 10, "a")
    out, ck = tmp_path / "out", tmp_path / "ck"
    query = start(kafka_stream(spark, kafka, ck, topic), out, ck)
    try:
        query.processAllAvailable()
        kafka.add_partitions(topic, 3)  # a partition added mid-run joins from earliest
        produce(kafka, topic, 3, 5, "b")
        query.processAllAvailable()
        assert regional.status(ck).regions[f"{topic}-2"].committed_offset == 5
        kafka.restart()  # the broker goes away mid-run and comes back on the same port
        produce(kafka, topic, 3, 5, "c")
        query.processAllAvailable()
    finally:
        query.stop()
    want = expected(kafka, topic)
    assert [len(want[f"{topic}-{p}"]) for p in range(3)] == [20, 20, 10]
    assert_exactly_once(out, want, spark)


def test_starting_offsets_latest_and_json_and_null_keys_and_values(spark, kafka, tmp_path):
    topic = new_topic(kafka, 2)
    produce(kafka, topic, 2, 4, "old")
    out, ck = tmp_path / "out", tmp_path / "ck"
    query = start(kafka_stream(spark, kafka, ck, topic, startingOffsets="latest"), out, ck)
    try:
        query.processAllAvailable()  # nothing new yet: no epoch, and "latest" stays where it was
        producer = kafka.producer()
        for p in range(2):
            producer.produce(topic, value=None, key=None, partition=p)  # null key and value: read, not rejected
            producer.produce(topic, value=b"new", partition=p)
        producer.flush(30)
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(table_rows(out)) == sorted((f"{topic}-{p}", o, v) for p in range(2) for o, v in
                                             ((4, None), (5, "new")))
    out2, ck2 = tmp_path / "out2", tmp_path / "ck2"
    query = start(kafka_stream(spark, kafka, ck2, topic, startingOffsets=f'{{"{topic}": {{"0": 3, "1": -2}}}}'),
                  out2, ck2, trigger={"availableNow": True})
    assert query.awaitTermination(120)
    got = sorted((r, o) for r, o, _ in table_rows(out2))
    assert got == [(f"{topic}-0", o) for o in (3, 4, 5)] + [(f"{topic}-1", o) for o in range(6)]


def test_records_lost_to_retention_fail_the_query_or_are_recorded(spark, kafka, tmp_path):
    topic = new_topic(kafka, 2)
    produce(kafka, topic, 2, 20, "a")
    out, ck, down = tmp_path / "out", tmp_path / "ck", tmp_path / "down"
    down.touch()
    lagging = f"{topic}-1"
    query = start(kafka_stream(spark, kafka, ck, topic, maxRecordsPerRegion="5"), out, ck, target=FLAKY,
                  failRegion=lagging, failWhileExists=str(down))
    try:
        wait_for_epochs(query, ck, 2)  # the lagging region is behind, at offset 0
        kafka.admin().delete_records([TopicPartition(topic, 1, 12)])[TopicPartition(topic, 1, 12)].result(30)
        error = failure_of(query)
    finally:
        query.stop()
    assert f"records [0, 12) of region '{lagging}' were deleted" in error and "failOnDataLoss" in error
    down.unlink()
    query = start(kafka_stream(spark, kafka, ck, topic, maxRecordsPerRegion="5", failOnDataLoss="false"), out, ck,
                  target=FLAKY, failRegion=lagging)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    st = regional.status(ck)
    assert [e.lost for e in st.epochs if e.lost] == [{lagging: (0, 12)}]
    want = expected(kafka, topic)
    assert [o for o, _ in want[lagging]] == list(range(12, 20))
    assert_exactly_once(out, want, spark)
    assert st.to_json()["regions"][lagging]["retention_headroom"] == 20 - 12


def test_a_deleted_topic_fails_the_query_naming_its_regions(spark, kafka, tmp_path):
    topic = new_topic(kafka, 1)
    produce(kafka, topic, 1, 3, "a")
    out, ck = tmp_path / "out", tmp_path / "ck"
    query = start(kafka_stream(spark, kafka, ck, topic), out, ck)
    query.processAllAvailable()
    kafka.delete_topic(topic)
    error = failure_of(query)
    assert f"{topic}-0 are gone from the source" in error and "failOnDataLoss" in error


@pytest.mark.parametrize("options, message", [
    ({"subscribe": "no-such-topic"}, "matched no partition"),
    ({"subscribe": "x", "assign": '{"x": [0]}'}, "exactly one of 'subscribe', 'subscribePattern' and 'assign'"),
    ({"subscribe": "x", "startingOffsets": '{"x": {"0": oops}}'}, "startingOffsets"),
    ({"subscribe": "x", "kafka.auto.offset.reset": "earliest"}, "set startingOffsets"),
])
def test_bad_options_are_clear_errors(spark, kafka, tmp_path, options, message):
    out, ck = tmp_path / "out", tmp_path / "ck"
    started = time.monotonic()
    with pytest.raises(Exception, match=message):
        query = start(kafka_stream(spark, kafka, ck, None, **options), out, ck)
        query.awaitTermination(60)
        query.stop()
    assert time.monotonic() - started < 60
    assert not out.exists()


def test_an_unreachable_broker_is_a_clear_error_in_bounded_time(spark, tmp_path):
    out, ck = tmp_path / "out", tmp_path / "ck"
    nobody = KafkaBroker.__new__(KafkaBroker)
    nobody.bootstrap = f"127.0.0.1:{free_port()}"
    query = start(kafka_stream(spark, nobody, ck, "orders", metadataTimeoutMs="3000"), out, ck)
    error = failure_of(query, timeout=90)
    assert "no answer from kafka.bootstrap.servers=" in error and "metadataTimeoutMs" in error


def test_a_restarted_driver_finds_the_partitions_of_the_epoch_it_re_runs(kafka):
    """A driver killed after Spark logged an epoch's offsets re-runs that epoch when it restarts, and Spark asks
    for its partitions before it lists the topic: the source must look them up (found by the random kills)."""
    from regional.inputs.kafka import create, region_of

    topic = new_topic(kafka, 2)
    source = create({"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic})
    split = source.split(region_of(topic, 1), 0, 10)
    assert (split.topic, split.partition) == (topic, 1)
    with pytest.raises(Exception, match="of a planned epoch is not a partition on the brokers now"):
        source.split(region_of(topic, 7), 0, 10)
    # a plan logged before the subscription changed still reads a partition the options no longer select
    dropped = new_topic(kafka, 1)
    split = source.split(region_of(dropped, 0), 0, 10)
    assert (split.topic, split.partition) == (dropped, 0) and not source.selects(region_of(dropped, 0))


def test_a_task_asks_librdkafka_for_no_more_records_than_its_range_holds(kafka, monkeypatch):
    """librdkafka's consume() returns when it has num_messages or at its timeout: a task that asked for a whole
    batch waited out the timeout at the end of every range (the soak's 64-partition epochs took 20 s, not 6)."""
    from regional.inputs.kafka import create, region_of

    topic = new_topic(kafka, 1)
    produce(kafka, topic, 1, 30, "a")
    asked = counted_consumes(monkeypatch)
    source = create({"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic})
    region = region_of(topic, 0)
    batches = list(source.read(region, 5, 25, source.split(region, 5, 25), batch_rows=10_000))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(5, 25))
    assert asked and max(asked) <= 20, asked


def test_a_pooled_consumer_reads_each_range_exactly_across_partitions_and_epochs(kafka):
    """Tasks in one Python worker share one consumer, assigned per range: ranges of other partitions and of the
    same partition again, back to back, read exactly their records; a read that does not end cleanly closes its
    consumer instead of handing it to the next task."""
    from regional.inputs.kafka import CONSUMERS, create, region_of

    topic = new_topic(kafka, 3)
    produce(kafka, topic, 3, 400, "p")
    source = create({"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic})
    CONSUMERS.close()
    created = CONSUMERS.created

    def offsets(partition: int, start: int, end: int, rows: int = 10_000) -> list[int]:
        region = region_of(topic, partition)
        return [o for b in source.read(region, start, end, source.split(region, start, end), batch_rows=rows)
                for o in b.column("offset").to_pylist()]

    # the same partition in consecutive ranges (a prefetch beyond the first range's end must not leak into the
    # second), other partitions in between, and a range starting below the previous one's
    for partition, start, end in [(0, 0, 100), (0, 100, 250), (1, 50, 60), (2, 0, 400), (0, 250, 400),
                                  (1, 0, 50), (1, 60, 400), (2, 10, 11)]:
        assert offsets(partition, start, end) == list(range(start, end)), (partition, start, end)
    assert CONSUMERS.created == created + 1, "every range should have reused the first consumer"

    region = region_of(topic, 0)
    reading = source.read(region, 0, 400, source.split(region, 0, 400), batch_rows=10)
    next(reading)
    reading.close()  # a task cancelled mid-range: its consumer is closed, not pooled
    assert offsets(1, 0, 400) == list(range(400))
    assert CONSUMERS.created == created + 2


def test_a_pooled_consumer_with_stale_metadata_is_replaced_within_the_read(kafka):
    """A topic deleted and created again after broker restarts: a pooled consumer keeps the old topic's leader
    epoch and ignores the new topic's metadata (librdkafka), so it read nothing until the task's poll timeout
    failed it (found by a review). A silent pooled consumer is replaced once, mid-read, from the next offset."""
    from regional.inputs.kafka import CONSUMERS, create, region_of

    topic = new_topic(kafka, 1)
    produce(kafka, topic, 1, 30, "old")
    source = create({"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic,
                     "kafkaConsumer.pollTimeoutMs": "15000"})
    region = region_of(topic, 0)

    def values(start: int, end: int) -> list[str]:
        return [v.decode() for b in source.read(region, start, end, source.split(region, start, end))
                for v in b.column("value").to_pylist()]

    CONSUMERS.close()
    assert values(0, 5) == [f"old-0-{i}" for i in range(5)]
    kafka.restart()  # raises the partition's leader epoch above the new topic's (one is enough: issue 57)
    assert values(5, 10) == [f"old-0-{i}" for i in range(5, 10)]
    kafka.delete_topic(topic)
    deadline = time.monotonic() + 30
    while True:  # the name is free once the deletion has gone through
        try:
            kafka.create_topic(topic, 1)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    produce(kafka, topic, 1, 10, "new")
    created = CONSUMERS.created
    assert values(0, 5) == [f"new-0-{i}" for i in range(5)]
    assert CONSUMERS.created == created + 1  # the pooled one was replaced


def test_records_of_any_size_are_read_in_batches_of_bounded_bytes(kafka, monkeypatch):
    """10,000 records of 256 KB made one 2.6 GB batch, which Arrow could not build: the query failed every epoch
    where Spark's Kafka source reads them (found with 9,000 such records). A task cuts its batches by bytes, and
    after its first lot asks librdkafka for no more records than fill a batch at the largest, not 10,000."""
    import random

    from regional.inputs.kafka import create, region_of

    topic = new_topic(kafka, 1)
    rng = random.Random(47)
    sizes = [rng.choice([0, 1, 100, 2_000, 9_000, 30_000]) for _ in range(1_500)]
    producer = kafka.producer()
    for i, size in enumerate(sizes):
        producer.produce(topic, key=None if i % 4 else f"k{i}".encode(),
                         value=None if size == 0 else (b"%06d" % i) * (size // 6 + 1), partition=0)
    assert producer.flush(30) == 0
    asked = counted_consumes(monkeypatch)
    source = create({"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic})
    source.batch_bytes = 100_000
    region = region_of(topic, 0)
    batches = list(source.read(region, 0, len(sizes), source.split(region, 0, len(sizes))))
    read: list[tuple[int, bytes | None, bytes | None]] = []
    for batch in batches:
        keys, values = batch.column("key").to_pylist(), batch.column("value").to_pylist()
        weight = sum(len(x) for x in keys + values if x is not None)
        assert weight <= 100_000 or batch.num_rows == 1, (weight, batch.num_rows)
        read += zip(batch.column("offset").to_pylist(), keys, values, strict=True)
    assert [o for o, _, _ in read] == list(range(len(sizes)))
    for offset, key, value in read:
        assert key == (None if offset % 4 else f"k{offset}".encode())
        assert value == (None if sizes[offset] == 0 else (b"%06d" % offset) * (sizes[offset] // 6 + 1))
    assert len(batches) >= sum(len(v or b"") for _, _, v in read) // 100_000
    assert asked[0] == 100 and max(asked[1:]) <= 100_000 // 30_000, asked  # the largest record: ~30 KB
