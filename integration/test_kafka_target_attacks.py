"""target=kafka attacked on the tests' real broker (issue 56's review): records the task's checks accept must be
records the driver's producer and the broker take, or the whole epoch fails for every region, at every restart.
The target is driven as the coordinator drives it (``prepare`` in the task, ``commit`` on the driver), no Spark."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from integration.test_kafka_target import new_topic, read_out
from regional.errors import RegionalConfigError
from regional.targets.base import QUERY_ID_OPTION, RowsInvalid
from regional.targets.kafka import KafkaTarget
from regional.targets.kafka.records import HEADERS
from regional.testing.kafka_broker import KafkaBroker


def target(kafka: KafkaBroker, tmp_path: Path, topic: str, **options: str) -> KafkaTarget:
    return KafkaTarget({"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic, "checkpointlocation": str(tmp_path),
                        QUERY_ID_OPTION: uuid.uuid4().hex, **options})


def rows(values: list[bytes], headers: list[list[dict[str, Any]]] | None = None) -> pa.RecordBatch:
    columns: dict[str, pa.Array] = {"value": pa.array(values, pa.binary())}
    if headers is not None:
        columns["headers"] = pa.array(headers, HEADERS)
    return pa.RecordBatch.from_pydict(columns)


@pytest.mark.parametrize("headers", [None, [{"key": "h", "value": b"1"}, {"key": "n", "value": None}]])
def test_a_record_librdkafka_refuses_at_produce_is_refused_in_the_task(kafka, tmp_path, headers):
    """librdkafka's produce() refuses a record whose key, value, headers and 36 bytes of largest-varint framing
    exceed the producer's message.max.bytes: such a record accepted in the task failed the whole epoch at commit
    (MSG_SIZE_TOO_LARGE) at every restart. The largest it takes is published; one byte more is the row's fault."""
    topic = new_topic(kafka, 1, {"max.message.bytes": "5000000"}, name="librdkafka-limit")
    framing = 36 + sum(2 + len(h["key"]) + len(h["value"] or b"") for h in headers or [])  # null: 1 byte, -1
    largest = 100_000 - framing
    kafka_target = target(kafka, tmp_path, topic, **{"kafka.message.max.bytes": "100000"})
    with pytest.raises(RowsInvalid, match="larger than Kafka takes"):
        kafka_target.prepare(0, "r", iter([rows([b"x" * (largest + 1)], [headers] if headers else None)]))
    handle = kafka_target.prepare(0, "r", iter([rows([b"y" * largest], [headers] if headers else None)]))
    kafka_target.commit(0, {"r": handle})
    # The brokers write the commit's markers after commit_transaction returns: a read_committed read at once may stop
    # short of them (the fresh clone's run read [] once); the record must show within a bounded wait.
    deadline = time.monotonic() + 15
    while not (landed := read_out(kafka, topic)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [len(r["value"]) for r in landed] == [largest]


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_records_that_each_fit_their_topic_are_not_batched_past_it(kafka, tmp_path, compression):
    """A topic's max.message.bytes bounds a whole record batch, and librdkafka fills batches up to batch.size
    (1,000,000): forty 30 KB records, each well within a topic of max.message.bytes 100,000, went as one batch
    and the broker refused it (MESSAGE_TOO_LARGE): the epoch failed for every region, at every restart."""
    topic = new_topic(kafka, 1, {"max.message.bytes": "100000"}, name="batched")
    kafka_target = target(kafka, tmp_path, topic, **{"kafka.compression.type": compression,
                                                      "kafka.linger.ms": "50"})
    values = [os.urandom(30_000) for _ in range(40)]  # incompressible: lz4 makes each a little larger
    handle = kafka_target.prepare(0, "r", iter([rows(values)]))
    kafka_target.commit(0, {"r": handle})
    assert [r["value"] for r in read_out(kafka, topic)] == values


def test_two_queries_staging_in_one_place_keep_each_others_files(kafka, tmp_path):
    """stagingLocation shared by two queries (one object-store prefix for a team's queries): a query's sweep of its
    recorded epochs removed the other query's staged files of those epoch numbers, decided but not yet produced,
    so the other's epoch failed at commit ("staged rows are missing") at every restart. Each query stages below
    its own query id."""
    topic = new_topic(kafka, 1, name="shared-staging")
    staging = str(tmp_path / "staging")
    ahead = target(kafka, tmp_path / "a", topic, staginglocation=staging)
    behind = target(kafka, tmp_path / "b", topic, staginglocation=staging)
    handle = behind.prepare(3, "r", iter([rows([b"behind-3"])]))
    ahead.prepare(12, "r", iter([rows([b"ahead-12"])]))
    ahead.sweep(10)  # the query ahead recorded epoch 10
    behind.commit(3, {"r": handle})
    assert [r["value"] for r in read_out(kafka, topic)] == [b"behind-3"]
    behind.sweep(3)  # and the query behind removes only its own
    left = list((tmp_path / "staging").rglob("*.arrow"))
    assert len(left) == 1 and left[0].relative_to(tmp_path / "staging").parts[:2] == (ahead.query_id, "12")


@pytest.mark.parametrize("name", ["bad topic!", "", "..", "t" * 250, "päth", "a/b"])
def test_a_row_naming_a_topic_kafka_can_never_have_is_its_own_fault(kafka, tmp_path, name):
    """A topic column naming a topic Kafka can never create (illegal characters, empty, '..', longer than 249) was
    taken for a topic missing for now: the region's task failed and it fell back at every epoch, for ever, its
    record never dead-lettered. It is the row's own fault (Spark's sink fails with InvalidTopicException); as the
    topic option, it is refused at start."""
    good = new_topic(kafka, 1, name="legal")
    kafka_target = KafkaTarget({"kafka.bootstrap.servers": kafka.bootstrap, "checkpointlocation": str(tmp_path),
                                QUERY_ID_OPTION: uuid.uuid4().hex})
    batch = pa.RecordBatch.from_pydict({"value": pa.array([b"ok", b"bad"], pa.binary()),
                                        "topic": pa.array([good, name])})
    with pytest.raises(RowsInvalid, match="Kafka"):
        kafka_target.prepare(0, "r", iter([batch]))
    assert kafka_target.prepare(0, "r", iter([batch.slice(0, 1)])) is not None  # a legal one is staged
    if name:  # an empty topic option is refused as empty already
        with pytest.raises(RegionalConfigError, match="the topic option"):
            target(kafka, tmp_path, name)
