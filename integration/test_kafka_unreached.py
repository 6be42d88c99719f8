"""source=kafka: partitions added to a subscribed topic while the query runs (issue 59, third pass). Spark's Kafka
source reads partitions that appear after its start from their earliest offset, whatever startingOffsets says; so does
regional: every record of a new partition once, including records produced into it before a plan saw it. (The
compacted topic and maxOffsetsPerTrigger over uneven partitions are compared with Spark's source in
test_kafka_parity.py, which runs Spark's reference child once for all its runs.)
"""

from __future__ import annotations

import os
import time

import pytest
from deltalake import DeltaTable

import regional
from regional.testing.kafka_broker import KafkaBroker

GROWN = f"unr{os.getpid()}.grown"


def produce(broker: KafkaBroker, topic: str, counts: dict[int, int], tag: str) -> None:
    producer = broker.producer()
    for p, n in counts.items():
        for i in range(n):
            producer.produce(topic, partition=p, value=f"{tag}-{p}-{i}".encode(), key=f"k{i}".encode())
    assert producer.flush(30) == 0


def everything(broker: KafkaBroker, topic: str) -> list[tuple[str, int, bytes | None]]:
    """What a plain consumer reads of the topic, every partition to its end: (region, offset, value)."""
    return sorted((r, o, v) for r, records in broker.records(topic, "read_uncommitted").items() for o, v in records)


@pytest.mark.campaign  # keeping the test command within CI's 30 minutes (the fresh clone's run took 31)
def test_partitions_added_while_running_deliver_every_record_once_from_earliest(spark, kafka, tmp_path):
    """startingOffsets=latest applies to the partitions present at the first plan; partitions added later are read
    from their earliest offset, as Spark's Kafka source reads them (its KafkaMicroBatchStream: "added partitions
    ... starting from earliest"), including records produced into them before the query's next plan saw them."""
    kafka.create_topic(GROWN, 2)
    produce(kafka, GROWN, {0: 3, 1: 3}, "old")  # before the start: latest skips these
    out, ck = tmp_path / "out", tmp_path / "ck"
    df = (spark.readStream.format("regional").option("source", "kafka")
          .option("kafka.bootstrap.servers", kafka.bootstrap).option("subscribe", GROWN)
          .option("startingOffsets", "latest").option("checkpointLocation", str(ck)).load())
    query = (df.select("region", "offset", "value").writeStream.format("regional").option("target", "delta")
             .option("path", str(out)).option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
             .trigger(processingTime="200 milliseconds").start())
    try:
        query.processAllAvailable()
        produce(kafka, GROWN, {0: 2, 1: 2}, "a")
        kafka.add_partitions(GROWN, 5)
        produce(kafka, GROWN, {0: 1, 2: 4, 3: 1, 4: 2}, "b")  # into the new partitions at once, before a plan
        query.processAllAvailable()
        kafka.add_partitions(GROWN, 7)
        produce(kafka, GROWN, {5: 3, 6: 1, 2: 1}, "c")
        ends = {f"{GROWN}-{p}": n for p, n in enumerate([6, 5, 5, 1, 2, 3, 1])}  # the records produced
        deadline = time.monotonic() + 60  # the partitions of the second growth: seen at a later plan
        while ({r: s.committed_offset for r, s in regional.status(ck).regions.items()} != ends
               and time.monotonic() < deadline):
            query.processAllAvailable()
            time.sleep(0.2)
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    want = [(r, o, v) for r, o, v in everything(kafka, GROWN) if not (v or b"").startswith(b"old-")]
    got = sorted((r["region"], r["offset"], r["value"]) for r in DeltaTable(str(out)).to_pyarrow_table().to_pylist())
    assert got == want
    assert {r for r, _, _ in got} == {f"{GROWN}-{p}" for p in range(7)}
    assert [o for r, o, _ in got if r == f"{GROWN}-2"] == [0, 1, 2, 3, 4]  # from earliest, each once
