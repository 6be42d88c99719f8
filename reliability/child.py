"""One driver of the campaign: a regional query from ``source`` into ``target`` until no input is left.

Usage: python -m reliability.child '<json of Query>'. The campaign SIGKILLs it at random moments.

With ``udf_faults`` the query maps values through a Python UDF that raises on a value starting ``poison``
(regional isolates it into ``dead_letters``) and sleeps ``slow_s`` on one starting ``slow``; with ``outages`` it also
calls a "service" that is down for a partition while ``<outages>/all`` or ``<outages>/p<partition>`` exists (the
soak's timers create and remove them; the partition comes from the value, ``<kind>-<partition>-<n>``). With ``until``
it runs until that file exists (the soak's producer keeps adding input), then publishes what is left and stops.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

import regional

TARGETS = {"delta": "delta", "python": "python:regional.testing.committer:EpochFilesTarget", "postgres": "postgres",
           "kafka": "kafka"}


@dataclass(frozen=True)
class Query:
    source: str  # files | kafka
    target: str  # delta | python | postgres | kafka | stock-kafka (Spark's own source and sink: the control)
    checkpoint: str
    input: str  # the files source's directory, or the Kafka topic
    out: str = ""  # the Delta table's or the committer's directory; the output topic of target=kafka
    bootstrap: str = ""
    url: str = ""  # PostgreSQL
    table: str = ""
    fail_share: float = 0.0
    max_per_region: int = 10
    master: str = "local[2,3]"
    udf_faults: bool = False
    slow_s: float = 0.0
    dead_letters: str = ""  # deadLetterPath
    until: str = ""  # run until this file exists
    outages: str = ""  # a directory of flag files: the service is down for every partition or for one
    s3_endpoint: str = ""  # the checkpoint, the table and the dead letters are s3a:// locations on this server

    def args(self) -> list[str]:
        return ["reliability.child", json.dumps(asdict(self))]


def run(q: Query) -> None:
    if q.target == "stock-kafka":
        return run_stock_kafka(q)
    conf = {}
    if q.s3_endpoint:
        from regional.testing.s3_server import spark_conf

        conf = spark_conf(q.s3_endpoint)
    spark = regional.local_spark(q.master, "regional-reliability", conf)
    regional.register(spark)
    reader = (spark.readStream.format("regional").option("source", q.source)
              .option("checkpointLocation", q.checkpoint).option("maxRecordsPerRegion", str(q.max_per_region)))
    if q.source == "files":
        reader = reader.option("path", q.input)
    else:
        reader = (reader.option("kafka.bootstrap.servers", q.bootstrap).option("subscribe", q.input)
                  .option("startingOffsets", "earliest"))
    df = reader.load()
    value = F.col("value").cast("string")
    mapped = faulty(q.slow_s, q.outages)(value) if q.udf_faults else F.upper(value)
    df = df.select("region", "offset", mapped.alias("value"))
    if q.target == "kafka":  # each record names its input (kafka_landed); a region keyed to one partition
        df = df.select("region", "offset", "value", F.col("region").alias("key"), F.array(
            F.struct(F.lit("region").alias("key"), F.col("region").cast("binary").alias("value")),
            F.struct(F.lit("offset").alias("key"), F.col("offset").cast("string").cast("binary").alias("value")),
        ).alias("headers"))
    writer = (df.writeStream.format("regional").option("checkpointLocation", q.checkpoint)
              .option("keepRegionColumns", "true").option("target", "python:reliability.faults:Flaky")
              .option("inner", TARGETS[q.target]).option("failShare", str(q.fail_share)))
    if q.target == "postgres":
        writer = writer.option("url", q.url).option("table", q.table)
    elif q.target == "kafka":
        writer = writer.option("topic", q.out).option("kafka.bootstrap.servers", q.bootstrap)
    else:
        writer = writer.option("path", q.out)
    if q.dead_letters:
        writer = writer.option("deadLetterPath", q.dead_letters)
    query = writer.start()
    while q.until and not Path(q.until).exists():
        if query.awaitTermination(2):  # raises if the query failed
            raise SystemExit("the query stopped on its own")
    query.processAllAvailable()
    query.stop()
    spark.stop()
    print("child finished", flush=True)


def run_stock_kafka(q: Query) -> None:
    """The control of target=kafka's series: Spark's own Kafka source into Spark's own Kafka sink (at least once),
    the same input, the same output columns, killed the same way."""
    from integration.stock_kafka import connector_jars
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(q.master).appName("stock-kafka-kills")
             .config("spark.jars", ",".join(connector_jars())).config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    region = F.concat_ws("-", "topic", F.col("partition").cast("string"))
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", q.bootstrap).option("subscribe", q.input)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(q.max_per_region * 6)).load()
          .select(region.alias("key"), F.upper(F.col("value").cast("string")).alias("value"), F.array(
              F.struct(F.lit("region").alias("key"), region.cast("binary").alias("value")),
              F.struct(F.lit("offset").alias("key"), F.col("offset").cast("string").cast("binary").alias("value")),
          ).alias("headers")))
    query = (df.writeStream.format("kafka").option("kafka.bootstrap.servers", q.bootstrap).option("topic", q.out)
             .option("checkpointLocation", q.checkpoint).start())
    query.processAllAvailable()
    query.stop()
    spark.stop()
    print("child finished", flush=True)


def faulty(slow_s: float, outages: str = "") -> Any:  # a pyspark UDF
    import os

    from pyspark.sql.functions import udf

    @udf("string")
    def transform(value: str) -> str:
        if outages:
            partition = value.split("-")[1]
            if os.path.exists(os.path.join(outages, "all")) or os.path.exists(os.path.join(outages, "p" + partition)):
                raise ConnectionError(f"the service behind partition {partition} is down")
        if value.startswith("poison"):
            raise ValueError(f"poison record {value}")
        if value.startswith("slow"):
            time.sleep(slow_s)
        return value.upper()
    return transform


if __name__ == "__main__":
    run(Query(**json.loads(sys.argv[1])))
