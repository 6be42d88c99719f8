"""Runs one regional query from a Kafka topic to a Kafka topic (target=kafka) until no input is left; the crash
tests kill it inside phase two.

Usage: python -m integration.kafka_target_child <brokers> <source topic> <output topic> <checkpoint>
"""

from __future__ import annotations

import sys

from pyspark.sql import functions as F

import regional


def main() -> None:
    brokers, topic, out_topic, ck = sys.argv[1:5]
    spark = regional.local_spark("local[2,3]", "regional-kafka-target-child")
    regional.register(spark)
    df = (spark.readStream.format("regional").option("source", "kafka").option("kafka.bootstrap.servers", brokers)
          .option("subscribe", topic).option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "16")
          .option("checkpointLocation", ck).load())
    traced = df.select("region", "offset", "key", F.concat_ws("|", "region", F.col("offset").cast("string"),
                                                              F.col("value").cast("string")).alias("value"))
    query = (traced.writeStream.format("regional").option("target", "kafka").option("topic", out_topic)
             .option("kafka.bootstrap.servers", brokers).option("checkpointLocation", ck).start())
    query.processAllAvailable()
    query.stop()
    print("child finished", flush=True)


if __name__ == "__main__":
    main()
