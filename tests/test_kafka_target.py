"""target=kafka without a broker: its options (honoured, mapped from Java's names, or refused by name), its columns
checked as Spark's Kafka sink checks them, the staged rows, and what makes a row a record Kafka refuses."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from regional.errors import RegionalConfigError
from regional.targets import load_target
from regional.targets.base import RowsInvalid
from regional.targets.kafka.records import (
    HEADERS,
    STAGED,
    TopicFacts,
    batch_bytes,
    check_columns,
    refusal,
    staged_batch,
)
from regional.targets.kafka.settings import check_producer, parse_settings, producer_settings

BASE = {"target": "kafka", "kafka.bootstrap.servers": "127.0.0.1:1", "topic": "out",
        "checkpointlocation": "/tmp/ck", "queryid": "q"}


def test_producer_settings_keep_librdkafka_names_and_map_javas():
    conf = producer_settings({**BASE, "kafka.linger.ms": "20", "kafka.max.request.size": "2000000",
                              "kafka.send.buffer.bytes": "-1", "kafka.acks": "all", "kafka.enable.idempotence": "true"})
    assert conf == {"bootstrap.servers": "127.0.0.1:1", "linger.ms": "20", "message.max.bytes": "2000000",
                    "socket.send.buffer.bytes": "0", "acks": "all", "enable.idempotence": "true"}


@pytest.mark.parametrize(("key", "value", "says"), [
    ("kafka.transactional.id", "mine", "regional-<query id>-kafka"),
    ("kafka.enable.idempotence", "false", "needs it on"),
    ("kafka.acks", "1", "acks=all"),
    ("kafka.request.required.acks", "0", "acks=all"),
    ("kafka.max.in.flight.requests.per.connection", "6", "1 to 5"),
    ("kafka.retries", "0", "retries without duplicates"),
    ("kafka.key.serializer", "x", "as Spark's Kafka sink refuses it"),
    ("kafka.partitioner.class", "x", "kafka.partitioner"),
    ("kafka.sasl.jaas.config", "x", "kafka.sasl.username"),
    ("kafka.buffer.memory", "1", "queue.buffering.max.kbytes"),
])
def test_settings_exactly_once_owns_or_librdkafka_lacks_are_refused_by_name(key, value, says):
    with pytest.raises(RegionalConfigError, match=key.replace(".", r"\.")) as caught:
        producer_settings({**BASE, key: value})
    assert says in str(caught.value)


def test_the_same_setting_twice_with_two_values_is_refused():
    with pytest.raises(RegionalConfigError, match="same librdkafka setting"):
        producer_settings({**BASE, "kafka.max.request.size": "1", "kafka.message.max.bytes": "2"})


def test_consumer_settings_and_unknown_names_are_refused_at_start_by_librdkafka_itself():
    with pytest.raises(RegionalConfigError, match=r"kafka\.isolation\.level.*consumer setting"):
        check_producer(producer_settings({**BASE, "kafka.isolation.level": "read_committed"}))
    with pytest.raises(RegionalConfigError, match="not a producer setting"):
        check_producer(producer_settings({**BASE, "kafka.no.such.thing": "1"}))
    check_producer(producer_settings({**BASE, "kafka.linger.ms": "5", "kafka.compression.type": "lz4"}))


def test_settings_need_brokers_and_stage_under_the_checkpoint_by_default():
    with pytest.raises(RegionalConfigError, match=r"kafka\.bootstrap\.servers"):
        parse_settings({k: v for k, v in BASE.items() if k != "kafka.bootstrap.servers"})
    with pytest.raises(RegionalConfigError, match="topic option is empty"):
        parse_settings({**BASE, "topic": " "})
    assert parse_settings(BASE).staging.path.endswith("/tmp/ck/kafka-staging")
    assert parse_settings({**BASE, "staginglocation": "/tmp/elsewhere"}).staging.path.endswith("/tmp/elsewhere")


def test_credentials_never_reach_the_targets_options_or_repr():
    target = load_target({**BASE, "kafka.sasl.password": "hunter2", "kafka.sasl.username": "me"})
    assert "hunter2" not in repr(target) and "hunter2" not in str(target.options)
    assert "hunter2" not in repr(vars(target).get("options"))


@pytest.mark.parametrize(("fields", "topic", "says"), [
    ([("key", pa.string())], "t", "Required attribute 'value' not found"),
    ([("value", pa.int64())], "t", "value attribute type must be a string or binary"),
    ([("value", pa.string()), ("key", pa.int32())], "t", "key attribute type must be a string or binary"),
    ([("value", pa.string())], None, "topic option required when no 'topic' attribute is present"),
    ([("value", pa.string()), ("topic", pa.int32())], None, "topic attribute type must be a string"),
    ([("value", pa.string()), ("partition", pa.int64())], "t", "partition attribute type must be an int"),
    ([("value", pa.string()), ("headers", pa.list_(pa.string()))], "t", "headers attribute type must be"),
])
def test_columns_are_checked_as_sparks_kafka_sink_checks_them(fields, topic, says):
    with pytest.raises(RegionalConfigError, match=says):
        check_columns(pa.schema(fields), topic)


def test_a_query_with_sparks_columns_passes_and_other_columns_are_ignored_as_spark_ignores_them():
    check_columns(pa.schema([("value", pa.binary()), ("key", pa.string()), ("headers", HEADERS),
                             ("topic", pa.string()), ("partition", pa.int32()), ("extra", pa.int64())]), None)


def test_staged_rows_are_bytes_and_the_topic_option_wins_over_the_column():
    batch = pa.RecordBatch.from_pydict({"value": ["é", None], "key": ["k", None], "topic": ["col", "col"],
                                        "extra": [1, 2]})
    staged = staged_batch(batch, "opt")
    assert staged.schema == STAGED
    assert staged.to_pydict() == {"key": [b"k", None], "value": ["é".encode(), None], "headers": [None, None],
                                  "topic": ["opt", "opt"], "partition": [None, None]}
    assert staged_batch(batch, None).column("topic").to_pylist() == ["col", "col"]


def _staged(**columns: list) -> pa.RecordBatch:
    rows = len(next(iter(columns.values())))
    batch = pa.RecordBatch.from_pydict({"value": [b"v"] * rows, **columns})
    return staged_batch(batch, None if "topic" in columns else "t")


FACTS = {"t": TopicFacts(partitions=3, max_batch_bytes=1000)}


def test_a_row_kafka_refuses_is_the_rows_own_fault():
    assert refusal(_staged(partition=pa.array([0, 2], pa.int32())), FACTS, 10_000, codec=None) is None
    found = refusal(_staged(partition=pa.array([1, 3], pa.int32())), FACTS, 10_000, codec=None)
    assert isinstance(found, RowsInvalid) and "partition 3" in str(found)
    found = refusal(_staged(topic=["t", None]), FACTS, 10_000, codec=None)
    assert isinstance(found, RowsInvalid) and "null topic" in str(found)
    big = staged_batch(pa.RecordBatch.from_pydict({"value": [b"x" * 990]}), "t")
    found = refusal(big, FACTS, 10_000, codec=None)
    assert isinstance(found, RowsInvalid) and "max.message.bytes" in str(found)
    assert refusal(big, FACTS, 10_000, codec="lz4") is None  # the broker checks the compressed batch
    assert isinstance(refusal(big, FACTS, 500, codec="lz4"), RowsInvalid)  # the producer's own limit
    # An incompressible record over the topic's limit is refused compressed too (before, the check was skipped with
    # a codec, and the broker refused the epoch at every restart)
    noise = staged_batch(pa.RecordBatch.from_pydict({"value": [random.Random(1).randbytes(1024)]}), "t")
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        assert isinstance(refusal(noise, FACTS, 10_000, codec=codec), RowsInvalid), codec


def test_a_one_record_batchs_size_follows_kafkas_record_format():
    # 61 bytes of batch header; the record: length varint, attributes, timestamp and offset deltas, key, value,
    # header count (KIP-98). A null key or value is one byte (length -1).
    assert batch_bytes(None, None, []) == 61 + 1 + 6
    assert batch_bytes(b"k", b"vv", []) == 61 + 1 + (3 + 2 + 3 + 1)
    # 100 and the body of 111 are two-byte varints (zigzag doubles them)
    assert batch_bytes(b"", b"x" * 100, [{"key": "h", "value": b"1"}]) == 61 + 2 + (3 + 1 + 2 + 100 + 1 + 2 + 2)


def test_sweep_removes_the_staged_files_of_recorded_epochs_only(tmp_path):
    target = load_target({**BASE, "checkpointlocation": str(tmp_path / "ck")})
    staging = tmp_path / "ck" / "kafka-staging" / target.query_id  # each query stages below its id
    for epoch in (3, 4, 5):
        (staging / str(epoch)).mkdir(parents=True)
        (staging / str(epoch) / "r-a.arrow").write_bytes(b"x")
    target.sweep(4)
    assert sorted(p.name for p in staging.iterdir()) == ["5"]
    assert (staging / "5" / "r-a.arrow").exists()


def test_the_column_bounds_never_clear_a_row_the_exact_check_refuses():
    """``refusal`` checks one by one only the rows its column bounds cannot clear: on random rows near the limits
    (sizes, partitions, headers with null keys), every row refused alone is among those."""
    from regional.targets.kafka.records import _may_be_refused, exact_refusal

    rng = random.Random(7)
    facts = {"t": TopicFacts(partitions=4, max_batch_bytes=600)}
    rows = []
    for _ in range(400):
        headers = None if rng.random() < 0.5 else [
            {"key": None if rng.random() < 0.05 else "h" * rng.randint(0, 20), "value": b"v" * rng.randint(0, 40)}
            for _ in range(rng.randint(0, 4))]
        rows.append({"key": None if rng.random() < 0.3 else b"k" * rng.randint(0, 50),
                     "value": None if rng.random() < 0.1 else b"x" * rng.randint(400, 560),
                     "headers": headers, "topic": "t",
                     "partition": None if rng.random() < 0.5 else rng.randint(-1, 5)})
    batch = pa.RecordBatch.from_pylist(rows, schema=STAGED)
    suspects = set(_may_be_refused(batch, facts, 580).tolist())
    refused = {i for i in range(len(rows)) if exact_refusal(batch.slice(i, 1), facts, 580, codec=None) is not None}
    assert refused and refused <= suspects
    assert len(suspects) < len(rows)  # the bounds clear some rows
