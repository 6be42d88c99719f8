"""source=kafka without a broker: options refused with clear errors, startingOffsets, data loss in the plan."""

from __future__ import annotations

import pickle

import pytest

from regional.errors import RegionalConfigError, RegionalDataLossError
from regional.inputs.base import RetainedInput
from regional.inputs.kafka import KafkaInput
from regional.protocol.decide import Outcome, RegionOutcome, decide
from regional.protocol.plan import Retention, plan_epoch
from regional.protocol.settings import Settings
from regional.store.model import EpochKind, EpochRecord, RegionState
from support import QUERY

BASE = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "orders"}


def kafka(**options: str) -> KafkaInput:
    return KafkaInput({**BASE, **options})


@pytest.mark.parametrize("options, message", [
    ({"kafka.bootstrap.servers": ""}, "kafka.bootstrap.servers"),
    ({"assign": '{"orders": [0]}'}, "exactly one of .*; got subscribe, assign"),
    ({"subscribe": "", "subscribePattern": "("}, "not a valid regular expression"),
    ({"subscribe": "", "assign": "[0, 1]"}, "assign '\\[0, 1\\]' is not valid"),
    ({"startingOffsets": '{"orders": {"0": oops}}'}, "startingOffsets .* is not 'earliest', 'latest' or JSON"),
    ({"startingOffsets": '{"orders": {"0": -3}}'}, "-2 \\(earliest\\) or -1 \\(latest\\)"),
    ({"kafka.auto.offset.reset": "earliest"}, "auto.offset.reset'.*set startingOffsets"),
    ({"kafka.enable.auto.commit": "true"}, "enable.auto.commit'.*set commitOffsetsToGroup"),
    ({"kafka.key.deserializer": "x"}, "key.deserializer'.*read as bytes"),
    ({"kafka.value.deserializer": "x"}, "value.deserializer'.*read as bytes"),
    ({"kafka.interceptor.classes": "x"}, "interceptor.classes'.*remove it"),
    ({"endingOffsets": "latest"}, "'endingOffsets'.*streaming"),
    ({"endingOffsetsByTimestamp": "{}"}, "'endingOffsetsByTimestamp'.*streaming"),
    ({"endingTimestamp": "1"}, "'endingTimestamp'.*no end"),
    ({"minPartitions": "8"}, "'minPartitions'.*one task"),
    ({"maxRecordsPerPartition": "8"}, "'maxRecordsPerPartition'.*maxRecordsPerRegion"),
    ({"minOffsetsPerTrigger": "8"}, "'minOffsetsPerTrigger'"),
    ({"maxTriggerDelay": "5m"}, "'maxTriggerDelay'"),
    ({"startingTimestamp": "yesterday"}, "startingTimestamp 'yesterday' is not a whole number"),
    ({"startingTimestamp": "5", "startingOffsets": "earliest"}, "startingTimestamp and startingOffsets both"),
    ({"startingOffsetsByTimestamp": '{"orders": {"0": "x"}}'}, "startingOffsetsByTimestamp .* is not JSON"),
    ({"startingOffsetsByTimestampStrategy": "latest"}, "applies only with startingTimestamp"),
    ({"startingTimestamp": "5", "startingOffsetsByTimestampStrategy": "first"}, "use 'error' .* or 'latest'"),
    ({"fetchOffset.numRetries": "-1"}, "fetchOffset.numRetries=-1 is too small"),
    ({"kafka.isolation.level": "serializable"}, "read_committed or read_uncommitted"),
    ({"kafka.no.such.setting": "1"}, "not a consumer setting"),
    ({"failOnDataLoss": "maybe"}, "not a boolean"),
])
def test_bad_options_are_refused_naming_what_to_do(options, message):
    with pytest.raises(RegionalConfigError, match=message):
        KafkaInput({**BASE, **options})


def test_the_input_is_a_retained_input_pickles_without_clients_and_types_rows_as_spark_does():
    source = kafka(includeHeaders="true")
    assert isinstance(source, RetainedInput) and source.fail_on_data_loss
    assert source.consumer_conf["isolation.level"] == "read_uncommitted"  # Spark's default
    source._admin = object()
    assert pickle.loads(pickle.dumps(source))._admin is None
    # Spark's columns in Spark's order (headers included), then regional's region
    assert source.schema_ddl == ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
                                 "timestamp TIMESTAMP, timestampType INT, "
                                 "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, region STRING")
    assert source.schema.names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                                   "headers", "region"]
    assert kafka().schema.names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                                    "region"]


def test_every_option_of_sparks_kafka_source_is_declared_and_every_declared_refusal_is_refused():
    """Spark 4.2's KafkaSourceProvider options (its keys, lower-cased there) each have regional's answer."""
    from regional.inputs.kafka import OPTIONS

    spark = ["assign", "subscribe", "subscribePattern", "startingOffsets", "endingOffsets",
             "startingOffsetsByTimestamp", "endingOffsetsByTimestamp", "startingTimestamp", "endingTimestamp",
             "failOnDataLoss", "minPartitions", "maxRecordsPerPartition", "maxOffsetsPerTrigger",
             "minOffsetsPerTrigger", "maxTriggerDelay", "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
             "kafkaConsumer.pollTimeoutMs", "startingOffsetsByTimestampStrategy", "groupIdPrefix", "includeHeaders",
             "kafka.bootstrap.servers", "kafka.group.id", "kafka.isolation.level", "kafka.security.protocol"]
    for name in spark:
        found = OPTIONS.find(name.lower())
        assert found is not None and found.stock, name
    for option in OPTIONS.options:
        if option.refused is not None:
            with pytest.raises(RegionalConfigError, match=f"does not take '{option.name}'"):
                KafkaInput({**BASE, option.name: "1"})


def test_group_ids_of_the_tasks_consumers():
    assert kafka().reader_group == "regional-reader"
    assert kafka(**{"kafka.group.id": "mine"}).reader_group == "mine"
    prefixed = kafka(groupIdPrefix="team-a")
    assert prefixed.reader_group.startswith("team-a-") and prefixed.reader_group.endswith("-executor")
    assert kafka(groupIdPrefix="team-a", **{"kafka.group.id": "mine"}).reader_group == "mine"  # as Spark


def test_a_pattern_is_found_anywhere_in_a_topic_name_as_sparks_admin_client_strategy_does():
    source = kafka(subscribe="", subscribePattern=" orders ")
    assert source.selects("orders-0") and source.selects("old-orders.eu-3") and not source.selects("order-1")
    anchored = kafka(subscribe="", subscribePattern="^orders$")
    assert anchored.selects("orders-0") and not anchored.selects("old-orders-0")


def test_starting_offsets_earliest_latest_and_json():
    available = {"orders-0": 50, "orders-1": 40}
    for word, want in (("earliest", {"orders-0": 10, "orders-1": 0}), ("latest", available)):
        source = kafka(startingOffsets=word)
        source._log_starts = {"orders-0": 10, "orders-1": 0}
        assert source.starting_offsets(available) == want
    source = kafka(startingOffsets='{"orders": {"0": 23, "1": -2}}')
    source._log_starts = {"orders-0": 10, "orders-1": 0}
    assert source.starting_offsets(available) == {"orders-0": 23, "orders-1": 0}
    with pytest.raises(RegionalConfigError, match="no offset for orders-1"):
        kafka(startingOffsets='{"orders": {"0": 23}}').starting_offsets(available)
    with pytest.raises(RegionalConfigError, match="past its end 50"):
        kafka(startingOffsets='{"orders": {"0": 51, "1": 0}}').starting_offsets(available)


def plan(states, available, log_starts, fail=True, first=None):
    return plan_epoch(4, QUERY, "/ck", states, available, Settings(), first_offsets=first,
                      retention=Retention(log_starts, fail))


def test_records_deleted_before_they_were_read_fail_the_plan_naming_region_and_range():
    with pytest.raises(RegionalDataLossError, match=r"records \[5, 12\) of region 'orders-1' were deleted"):
        plan({"orders-1": RegionState(5, 2)}, {"orders-1": 30}, {"orders-1": 12})


def test_with_fail_on_data_loss_false_the_plan_skips_them_and_the_record_keeps_the_loss():
    states = {"orders-0": RegionState(5, 2), "orders-1": RegionState(7, 2), "idle": RegionState(3, 1)}
    p = plan(states, {"orders-0": 30, "orders-1": 9, "idle": 3}, {"orders-0": 12, "orders-1": 0, "idle": 8},
             fail=False)
    assert [(r.region, r.start, r.end) for r in p.regions] == [("orders-0", 12, 30), ("orders-1", 7, 9)]
    assert p.lost == {"orders-0": (5, 12), "idle": (3, 8)}
    # orders-0 fails in the target: it still moves past what is gone; the idle region moves too
    record = decide(p, {"orders-0": RegionOutcome("orders-0", Outcome.FAILED, 12, reason="down"),
                        "orders-1": RegionOutcome("orders-1", Outcome.WRITTEN, 9, 2)},
                    EpochRecord(3, EpochKind.GLOBAL, {}, {}, states))
    assert record.lost == {"orders-0": (5, 12), "idle": (3, 8)}
    assert record.regions["orders-0"].committed_offset == 12 and record.regions["orders-0"].ref_epoch == 2
    assert record.regions["idle"].committed_offset == 8
    assert record.regions["orders-1"].committed_offset == 9


def test_a_log_that_went_backwards_is_data_loss_and_new_regions_start_where_told():
    with pytest.raises(RegionalDataLossError, match="truncated, or its topic deleted and created again"):
        plan({"t-0": RegionState(40, 2)}, {"t-0": 3}, {"t-0": 0})
    p = plan({"t-0": RegionState(40, 2)}, {"t-0": 3, "t-1": 9, "t-2": 9}, {"t-0": 0, "t-1": 4, "t-2": 0},
             fail=False, first={"t-2": 6})
    assert [(r.region, r.start, r.end) for r in p.regions] == [("t-0", 0, 3), ("t-1", 4, 9), ("t-2", 6, 9)]
    assert p.lost == {"t-0": (40, 0)}
    # a region failing in its first epoch keeps its first offset, not 0
    record = decide(p, {"t-0": RegionOutcome("t-0", Outcome.WRITTEN, 3, 3),
                        "t-1": RegionOutcome("t-1", Outcome.WRITTEN, 9, 5),
                        "t-2": RegionOutcome("t-2", Outcome.FAILED, 6, reason="down")}, None)
    assert record.regions["t-2"].committed_offset == 6 and record.regions["t-2"].ref_epoch == -1


def test_a_replaced_log_is_read_from_its_start_whatever_its_end_and_the_loss_is_recorded():
    """A topic created again with more records than the committed offset: nothing in the offsets shows it; the
    input's topic ids do, and the plan reads the region from its log start."""
    states = {"orders-0": RegionState(5, 2), "orders-1": RegionState(5, 2)}
    p = plan_epoch(4, QUERY, "/ck", states, {"orders-0": 12, "orders-1": 12}, Settings(),
                   retention=Retention({"orders-0": 0, "orders-1": 0}, False, frozenset({"orders-0"})))
    assert [(r.region, r.start, r.end) for r in p.regions] == [("orders-0", 0, 12), ("orders-1", 5, 12)]
    assert p.lost == {"orders-0": (5, 0)}


def test_a_regions_topic_id_is_the_one_in_force_when_its_offset_last_moved():
    from regional.inputs.kafka import _ids_at

    history = [(0, {"a": "id1"}), (3, {"a": "id1", "b": "idb"}), (7, {"a": "id2", "b": "idb"})]
    assert [_ids_at(history, e, "a") for e in (None, 0, 2, 3, 6, 7, 9)] == ["id1"] * 5 + ["id2"] * 2
    assert [_ids_at(history, e, "b") for e in (None, 2, 3, 8)] == ["idb", None, "idb", "idb"]


def test_the_kafka_input_pickles_without_its_store(tmp_path):
    from regional.store import Store

    source = kafka()
    source.use_store(Store(tmp_path / "ck"))
    copy = pickle.loads(pickle.dumps(source))
    assert copy._store is None and copy._ids_log is None


def test_the_consumer_pool_keeps_a_few_idle_consumers_by_configuration(monkeypatch):
    """Idle consumers are kept per configuration (the logger aside), at most ``limit`` in all, the least recently
    used closed first; a consumer whose read failed is closed; REGIONAL_KAFKA_POOL=off keeps none."""
    import logging

    from regional.inputs.kafka import ConsumerPool

    def conf(client: str, level: int = logging.CRITICAL) -> dict:
        logger = logging.getLogger(f"regional.test.pool.{level}")
        logger.setLevel(level)
        return {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "client.id": client, "logger": logger}

    pool = ConsumerPool(limit=2)
    a, reused = pool.take(conf("a"))
    assert not reused
    pool.give_back(conf("a"), a, reusable=True)
    again, reused = pool.take(conf("a", logging.DEBUG))  # another logger level: the same configuration
    assert again is a and reused
    pool.give_back(conf("a"), a, reusable=True)
    b, _ = pool.take(conf("b"))
    c, _ = pool.take(conf("c"))
    pool.give_back(conf("b"), b, reusable=True)
    pool.give_back(conf("c"), c, reusable=True)  # three idle: a, the least recently used, is closed
    with pytest.raises(RuntimeError):
        a.assign([])
    assert pool.take(conf("b")) == (b, True) and pool.take(conf("c")) == (c, True)
    pool.give_back(conf("b"), b, reusable=False)  # its read failed: closed, not kept
    with pytest.raises(RuntimeError):
        b.assign([])
    assert pool.take(conf("b"))[1] is False
    pool.close()

    for value in ("off", "false", "0"):
        monkeypatch.setenv("REGIONAL_KAFKA_POOL", value)
        off = ConsumerPool()
        d, _ = off.take(conf("d"))
        off.give_back(conf("d"), d, reusable=True)
        assert off.take(conf("d"))[1] is False


def test_a_batch_holds_each_records_key_value_and_time_as_fetched():
    """Keys and values go to Arrow joined, not one by one: nulls, empty values and every timestamp kind survive."""
    import pyarrow as pa
    from confluent_kafka import Message

    from regional.inputs.kafka.reading import SCHEMA, PartitionSplit, _binary, _Rows

    fetched = [
        (b"k0", b"v0", (1, 1_700_000_000_123)), (None, b"", (2, 5)), (b"", None, (0, -1)), (None, None, (1, 0)),
        (b"\x00\xff", b"x" * 1000, (1, 7)),
    ]
    messages = [Message(topic="orders", partition=2, offset=10 + i, key=k, value=v, timestamp=t)
                for i, (k, v, t) in enumerate(fetched)]
    rows = _Rows("orders-2", PartitionSplit("orders", 2), headers=False)
    assert not list(rows.add(messages[:2], [10, 11], SCHEMA))
    assert not list(rows.add(messages[2:], [12, 13, 14], SCHEMA))
    batch = rows.batch(SCHEMA)
    batch.validate(full=True)
    assert batch.column("key").to_pylist() == [k for k, _, _ in fetched]
    assert batch.column("value").to_pylist() == [v for _, v, _ in fetched]
    assert batch.column("offset").to_pylist() == [10, 11, 12, 13, 14]
    assert batch.column("timestampType").to_pylist() == [0, 1, -1, 0, 0]
    micros = [None if kind == 0 else ms * 1000 for _, _, (kind, ms) in fetched]
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == micros
    assert len(rows) == 0 and rows.batch(SCHEMA).num_rows == 0  # the next batch starts empty
    for items in ([], [None, None], [b"a", None, b""], [b"", b""]):
        assert _binary(list(items)).equals(pa.array(items, pa.binary()))


@pytest.mark.parametrize(("headers", "cut"), [
    (False, [[0, 1], [2, 3, 4], [5], [6, 7, 8], [9], [10], [11]]),
    (True, [[0, 1], [2], [3, 4], [5], [6], [7, 8], [9], [10], [11]]),  # 6 bytes of headers each
])
def test_a_batch_holds_at_most_its_bytes_and_a_larger_record_alone(headers, cut):
    """10,000 Kafka records of 1 MB were one 10 GB batch, and past 2 GiB of values the batch failed to build
    (a region that failed every epoch). A lot is cut where the batch's bytes are full; nothing is lost or moved."""
    from confluent_kafka import Message

    from regional.inputs.kafka.reading import SCHEMA, SCHEMA_WITH_HEADERS, PartitionSplit, _Rows

    schema = SCHEMA_WITH_HEADERS if headers else SCHEMA
    sizes = [10, 10, 50, 5, 0, 200, 30, 30, 1, 60, 61, 7]
    messages = [Message(topic="t", partition=0, offset=i, key=b"k" if i % 3 == 0 else None,
                        value=None if size == 0 else bytes([65 + i]) * size, timestamp=(1, i),
                        headers=[("h", b"x" * 4), ("n", None)] if headers else None)
                for i, size in enumerate(sizes)]
    weight = [(1 if i % 3 == 0 else 0) + size + (6 if headers else 0) for i, size in enumerate(sizes)]
    rows = _Rows("t-0", PartitionSplit("t", 0), headers=headers, batch_bytes=64)
    assert rows.lot_size(10_000) == 100  # sizes unknown: a small first lot
    batches = list(rows.add(messages[:3], [0, 1, 2], schema))  # 10+10+50: the third does not fit
    batches += list(rows.add(messages[3:], list(range(3, len(sizes))), schema))
    batches.append(rows.batch(schema))
    assert [b.column("offset").to_pylist() for b in batches] == cut
    for batch in batches:
        offsets = batch.column("offset").to_pylist()
        assert sum(weight[o] for o in offsets) <= 64 or len(offsets) == 1
        assert batch.column("value").to_pylist() == [messages[o].value() for o in offsets]
        assert batch.column("key").to_pylist() == [messages[o].key() for o in offsets]
        if headers:
            assert batch.column("headers").to_pylist() == [
                [{"key": "h", "value": b"xxxx"}, {"key": "n", "value": None}]] * len(offsets)
    assert rows.lot_size(10_000) == 1  # a 200-byte record was read: one record at a time fills 64 bytes
    wider = _Rows("t-0", PartitionSplit("t", 0), headers=headers, batch_bytes=1_000)
    assert not list(wider.add(messages[:3], [0, 1, 2], schema))
    largest = 1 + 50 + (6 if headers else 0)  # the largest key plus the largest value (and headers)
    assert (wider.lot_size(10_000), wider.lot_size(5)) == (1_000 // largest, 5)


def test_time_spark_holds_a_batch_is_not_a_wait_for_kafka(monkeypatch):
    """kafkaConsumer.pollTimeoutMs bounds a task's wait for records; a batch held downstream longer than that
    failed the read with 'no record arrived' while records were arriving (found by a review)."""
    import time

    from confluent_kafka import Message

    import regional.inputs.kafka as kafka_input
    from regional.inputs.kafka.reading import PartitionSplit

    log = [Message(topic="t", partition=0, offset=i, key=None, value=b"x" * 40, timestamp=(1, i)) for i in range(6)]

    class Scripted:  # hands out at most 2 records per consume, as a slow fetch would
        position = 0

        def assign(self, partitions):
            self.position = partitions[0].offset

        def consume(self, num_messages=1, timeout=-1):
            out = log[self.position:self.position + min(num_messages, 2)]
            self.position += len(out)
            return out

    monkeypatch.setattr(kafka_input.CONSUMERS, "take", lambda conf, fresh=False: (Scripted(), False))
    monkeypatch.setattr(kafka_input.CONSUMERS, "give_back", lambda conf, consumer, reusable: None)
    for batch_bytes, batch_rows in ((64, 10_000), (1 << 20, 1)):  # cut by bytes mid-lot, and by rows
        source = kafka_input.create({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t",
                                     "kafkaConsumer.pollTimeoutMs": "100"})
        source.batch_bytes = batch_bytes
        read = []
        for batch in source.read("t-0", 0, 6, PartitionSplit("t", 0), batch_rows=batch_rows):
            read += batch.column("offset").to_pylist()
            time.sleep(0.15)  # Spark holds the batch longer than pollTimeoutMs
        assert read == list(range(6))
