"""Runs one regional query from a Kafka topic with poison records, its dead letters to a Kafka topic, until no input
is left; the crash test kills it while it produces them.

Usage: python -m integration.dead_letter_topic_child <brokers> <source topic> <out> <checkpoint> <dead-letter topic>
       <poison value>...
"""

from __future__ import annotations

import sys

from pyspark.sql import functions as F

import regional
from integration.helpers import poison_udf


def main() -> None:
    brokers, topic, out, ck, dead = sys.argv[1:6]
    # No retries: the shipped 4, a minute apart, take minutes per poison record (issue 45).
    spark = regional.local_spark("local[2,3]", "regional-dead-letter-topic-child",
                                 {"spark.regional.deadLetterRetries": "0"})
    regional.register(spark)
    parse = poison_udf(set(sys.argv[6:]))
    df = (spark.readStream.format("regional").option("source", "kafka").option("kafka.bootstrap.servers", brokers)
          .option("subscribe", topic).option("startingOffsets", "earliest").option("checkpointLocation", ck).load())
    query = (df.select("region", "offset", parse(F.col("value").cast("string")).alias("value")).writeStream
             .format("regional").option("target", "delta").option("path", out).option("checkpointLocation", ck)
             .option("keepRegionColumns", "true").option("deadLetterTopic", dead)
             .option("deadLetter.kafka.bootstrap.servers", brokers).start())
    query.processAllAvailable()
    query.stop()
    print("child finished", flush=True)


if __name__ == "__main__":
    main()
