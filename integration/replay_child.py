"""Replays a dead-letter table (or topic) into a Delta target with Trigger.AvailableNow (the UDF fixed:
upper-casing); the crash tests kill it in phase two and before the replay's marks.

Usage: python -m integration.replay_child <dead letters> <out> <checkpoint> <the replay's dead letters>
(the dead letters: a table, or kafka:<topic>@<brokers>)
"""

from __future__ import annotations

import sys

from pyspark.sql import functions as F

import regional


def main() -> None:
    dlq, out, ck, dlq_replay = sys.argv[1:5]
    # No retries: the shipped 4, a minute apart, take minutes per poison record (issue 45).
    spark = regional.local_spark("local[2,3]", "regional-replay-child",
                                 {"spark.regional.deadLetterRetries": "0"})
    regional.register(spark)
    reader = spark.readStream.format("regional").option("source", "deadLetters")
    if dlq.startswith("kafka:"):  # kafka:<topic>@<brokers>: a dead-letter topic
        topic, brokers = dlq[len("kafka:"):].rsplit("@", 1)
        reader = reader.option("topic", topic).option("kafka.bootstrap.servers", brokers)
    else:
        reader = reader.option("path", dlq)
    df = reader.option("checkpointLocation", ck).option("maxRecordsPerRegion", "2").load()
    query = (df.select("region", "offset", F.upper("value").alias("value")).writeStream.format("regional")
             .option("target", "delta").option("path", out).option("checkpointLocation", ck)
             .option("keepRegionColumns", "true").option("deadLetterPath", dlq_replay)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    print("child finished", flush=True)


if __name__ == "__main__":
    main()
